import Foundation
import Glibc

extension TokenFileLock {
    /// Runs `body` holding the lock a refreshing tokenrelay takes (`<file>.lock`), for the one-shot
    /// commands that write the token file (`token import`, `login`): their write never lands in the
    /// middle of a rotation. There is no event loop to keep responsive, so this simply blocks, polling
    /// for up to `timeout` seconds (a blocking flock could not be given a deadline).
    static func withBlockingLock<T>(tokenFilePath: String, timeout: Double = 30, _ body: () throws -> T) throws -> T {
        let lockPath = tokenFilePath + ".lock"
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw TokenFileError(lockPath, "cannot open lock file: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let deadline = Date(timeIntervalSinceNow: timeout)
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard Date() < deadline else { throw TokenFileError(lockPath, "still locked by a refreshing tokenrelay after \(Int(timeout)) s") }
            usleep(20_000)
        }
        defer { flock(fd, LOCK_UN) }
        return try body()
    }
}
