import Foundation
import CLibevent
@testable import TokenRelay
import XCTest

/// The token file's write (with fsync) and a contended lock wait run on a helper thread: the loop keeps
/// serving meanwhile, and the result comes back on the loop's own thread.
final class OffLoopWorkTests: XCTestCase {
    func testLoopKeepsRunningWhileWorkBlocksAndResultArrivesOnTheLoopThread() throws {
        let loop = try EventLoop()
        let release = DispatchSemaphore(value: 0)
        var ticksWhileBlocked = 0
        var deliveredOnLoopThread = false
        var delivered: Int?
        let loopThread = pthread_self()

        var ticker: LoopEvent?
        ticker = LoopEvent(loop: loop, events: Int32(EV_PERSIST)) { _ in
            ticksWhileBlocked += 1
            if ticksWhileBlocked == 3 { release.signal() }  // the loop ran three timer ticks while the work was stuck
        }
        ticker?.schedule(after: 0.01)
        let deadline = LoopEvent(loop: loop) { _ in loop.stop() }
        deadline.schedule(after: 10)

        OffLoopWork.run(on: loop, { () -> Int in
            _ = release.wait(timeout: .now() + 10)
            return 42
        }) { value in
            delivered = value
            deliveredOnLoopThread = pthread_equal(pthread_self(), loopThread) != 0
            ticker = nil
            loop.stop()
        }
        XCTAssertNil(delivered, "never delivered inside run()")
        loop.run()

        XCTAssertEqual(delivered, 42)
        XCTAssertTrue(deliveredOnLoopThread)
        XCTAssertGreaterThanOrEqual(ticksWhileBlocked, 3)
    }
}
