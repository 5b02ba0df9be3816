import FoundationEssentials
import Glibc

/// An advisory lock (flock) on `<token file>.lock`, serialising refreshes across tokenrelay processes
/// that share one token file (a rolling restart, a second copy started by mistake). The token file itself
/// is replaced by rename on every write, so it cannot carry the lock.
///
/// Waiting never blocks the event loop: an uncontended lock is taken at once; a contended one is
/// polled on a helper thread (`OffLoopWork`).
final class TokenFileLock {
    let path: String
    private let fd: Int32
    private let loop: EventLoop
    private var isWaiting = false
    private(set) var isHeld = false

    init(tokenFilePath: String, loop: EventLoop) throws {
        path = Self.lockPath(forTokenFile: tokenFilePath)
        self.loop = loop
        fd = try Self.openLockFile(path)
    }

    /// The lock lives next to the token file, shared by the proxy, `token import` and `login`.
    static func lockPath(forTokenFile tokenFilePath: String) -> String { tokenFilePath + ".lock" }

    static func openLockFile(_ path: String) throws -> Int32 {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw TokenFileError(path, "cannot open lock file: \(String(cString: strerror(errno)))") }
        return fd
    }

    /// Tries for the exclusive lock until `deadline` (monotonic seconds). Polling keeps the wait bounded;
    /// a blocking flock could not be given a deadline.
    static func pollExclusive(_ fd: Int32, until deadline: Double, every interval: useconds_t) -> Bool {
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard EventLoop.monotonicNow < deadline else { return false }
            usleep(interval)
        }
        return true
    }

    deinit { close(fd) }

    /// Calls `completion(true)` on the loop once the lock is held, or `completion(false)` after `timeout`.
    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void) {
        precondition(!isWaiting && !isHeld, "one acquisition at a time")
        if flock(fd, LOCK_EX | LOCK_NB) == 0 {
            isHeld = true
            return completion(true, false)
        }
        isWaiting = true
        let descriptor = fd
        let deadline = EventLoop.monotonicNow + timeout
        OffLoopWork.run(on: loop, { Self.pollExclusive(descriptor, until: deadline, every: 5_000) }) { [weak self] acquired in
            guard let self else { return }
            self.isWaiting = false
            self.isHeld = acquired
            completion(acquired, true)
        }
    }

    func release() {
        guard isHeld else { return }
        flock(fd, LOCK_UN)
        isHeld = false
    }
}
