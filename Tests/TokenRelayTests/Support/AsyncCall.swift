import Foundation

/// A blocking call running on its own thread, so a test can do something else while it is in flight.
final class AsyncCall<T: Sendable>: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private let result = Locked<Result<T, Error>?>(nil)

    init(_ body: @escaping @Sendable () throws -> T) {
        let thread = Thread { [result, done] in
            let outcome = Result { try body() }
            result.withLock { $0 = outcome }
            done.signal()
        }
        thread.start()
    }

    func wait(timeout: Double) throws -> T {
        guard done.wait(timeout: .now() + timeout) == .success else {
            throw TestSupportError("call did not finish within \(timeout) s", isTimeout: true)
        }
        return try result.withLock { $0! }.get()
    }
}

extension HTTPTestClient {
    static func concurrentlyAsync<T: Sendable>(_ body: @escaping @Sendable () throws -> T) -> AsyncCall<T> {
        AsyncCall(body)
    }
}
