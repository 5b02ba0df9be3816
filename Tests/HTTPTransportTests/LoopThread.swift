import Foundation
import HTTPTransport
import XCTest

/// A TransportLoop on its own thread, with work posted to it from the test thread.
final class LoopThread: @unchecked Sendable {
    let loop: TransportLoop
    private let lock = NSLock()
    private var queue: [() -> Void] = []
    private let stopped = DispatchSemaphore(value: 0)

    init() throws {
        loop = try TransportLoop()
        loop.onWake { [unowned self] in
            let work = self.lock.withLock { () -> [() -> Void] in
                defer { self.queue.removeAll() }
                return self.queue
            }
            for item in work { item() }
        }
        let handle = TransportLoopHandle(loop)
        let done = stopped
        Thread {
            handle.loop.run()
            done.signal()
        }.start()
    }

    /// Runs `work` on the loop thread (soon; not waiting for it).
    func post(_ work: @escaping () -> Void) {
        lock.withLock { queue.append(work) }
        loop.wake()
    }

    /// Runs `work` on the loop thread and waits for its result.
    func sync<T>(_ work: @escaping () -> T) -> T {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox<T>()
        post {
            box.value = work()
            done.signal()
        }
        _ = done.wait(timeout: .now() + 10)
        return box.value!
    }

    func stop() {
        post { [loop] in loop.stop() }
        _ = stopped.wait(timeout: .now() + 10)
    }
}

final class ResultBox<T>: @unchecked Sendable {
    var value: T?
}

/// Waits, bounded, until `condition` holds (checked on each event signalled by the code under test).
func waitUntil(_ signal: DispatchSemaphore, timeout: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while !condition() {
        let left = deadline.timeIntervalSinceNow
        if left <= 0 { return false }
        _ = signal.wait(timeout: .now() + left)
    }
    return true
}

/// A test case whose every test gets a fresh loop thread, stopped after it.
class LoopThreadTestCase: XCTestCase {
    var loopThread: LoopThread!

    override func setUpWithError() throws {
        try super.setUpWithError()
        loopThread = try LoopThread()
    }

    override func tearDown() {
        loopThread.stop()
        loopThread = nil
        super.tearDown()
    }
}
