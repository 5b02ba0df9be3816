import Foundation

/// Mutable state guarded by an NSLock, for state shared between test threads and server threads.
///
/// Used instead of `Synchronization.Mutex` on purpose: with swift 6.3 on Linux, Mutex's futex-based
/// lock is invisible to ThreadSanitizer, so contended `Mutex.withLock` produces false
/// "Swift access race" reports. NSLock (pthread mutex) is understood by TSan, which keeps
/// `swift test --sanitize=thread` free of noise from the test-support code.
final class Locked<State>: @unchecked Sendable {
    private let lock = NSLock()
    private var state: State

    init(_ state: State) { self.state = state }

    func withLock<R>(_ body: (inout State) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&state)
    }
}
