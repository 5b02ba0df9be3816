import FoundationEssentials
import Glibc

extension TokenFileLock {
    /// Runs `body` holding the lock a refreshing tokenrelay takes (`<file>.lock`), for the one-shot
    /// commands that write the token file (`token import`, `login`): their write never lands in the
    /// middle of a rotation. There is no event loop to keep responsive, so this simply blocks, polling
    /// for up to `timeout` seconds (a blocking flock could not be given a deadline).
    static func withBlockingLock<T>(tokenFilePath: String, timeout: Double = 30, _ body: () throws -> T) throws -> T {
        let lockPath = lockPath(forTokenFile: tokenFilePath)
        let fd = try openLockFile(lockPath)
        defer { close(fd) }
        guard pollExclusive(fd, until: EventLoop.monotonicNow + timeout, every: 20_000) else {
            throw TokenFileError(lockPath, "still locked by a refreshing tokenrelay after \(Int(timeout)) s")
        }
        defer { flock(fd, LOCK_UN) }
        return try body()
    }
}
