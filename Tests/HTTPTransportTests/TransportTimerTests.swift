import Foundation
import HTTPTransport
import XCTest

final class TransportTimerTests: XCTestCase {

    func testFiresOnceAfterItsDelayAndNotWhenCancelled() throws {
        let loopThread = try LoopThread()
        defer { loopThread.stop() }
        let fired = DispatchSemaphore(value: 0)
        let counter = ResultBox<Int>()
        counter.value = 0
        let loop = loopThread.loop
        let box = ResultBox<(TransportTimer, TransportTimer, TransportTimer)>()
        box.value = loopThread.sync {
            let quick = TransportTimer(loop: loop) { counter.value! += 1; fired.signal() }
            let cancelled = TransportTimer(loop: loop) { counter.value! += 100; fired.signal() }
            let clamped = TransportTimer(loop: loop) { counter.value! += 10; fired.signal() }
            quick.schedule(after: 0.05)
            cancelled.schedule(after: 0.1)
            cancelled.cancel()
            clamped.schedule(after: -Double.infinity)   // clamped to 0, never a trap
            return (quick, cancelled, clamped)
        }
        XCTAssertEqual(fired.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(fired.wait(timeout: .now() + 5), .success)
        // The cancelled timer would have fired by 0.1 s; give it well past that, bounded.
        XCTAssertEqual(fired.wait(timeout: .now() + 0.5), .timedOut)
        XCTAssertEqual(loopThread.sync { counter.value! }, 11)
        XCTAssertFalse(loopThread.sync { box.value!.0.isScheduled || box.value!.1.isScheduled || box.value!.2.isScheduled })
        loopThread.sync { box.value = nil }   // timers are freed on their loop's thread
    }
}
