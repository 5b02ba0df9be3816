import Foundation
import Glibc
import HTTPTransport
import XCTest

/// The loop primitives tokenrelay's runtime uses instead of raw libevent events: repeating timers,
/// signal watches and wake-ups from other threads.
final class LoopPrimitiveTests: XCTestCase {

    func testRepeatingTimerFiresUntilCancelled() throws {
        let loopThread = try LoopThread()
        defer { loopThread.stop() }
        let fired = DispatchSemaphore(value: 0)
        let count = ResultBox<Int>()
        count.value = 0
        let loop = loopThread.loop
        let timer = ResultBox<TransportTimer>()
        loopThread.sync {
            let repeating = TransportTimer(loop: loop, repeats: true) { count.value! += 1; fired.signal() }
            repeating.schedule(after: 0.01)
            timer.value = repeating
        }
        XCTAssertTrue(waitUntil(fired) { loopThread.sync { count.value! } >= 3 }, "a repeating timer fires more than once")
        XCTAssertTrue(loopThread.sync { timer.value!.isScheduled }, "a repeating timer stays scheduled after firing")
        let atCancel = loopThread.sync { () -> Int in
            timer.value!.cancel()
            return count.value!
        }
        // Signals of firings before the cancel that `waitUntil` did not consume are still counted by the
        // semaphore (a loaded machine lets the timer fire several times between checks): take them first,
        // at most one per firing, so that only a firing after the cancel can end the wait below early.
        for _ in 0...atCancel where fired.wait(timeout: .now()) == .success {}
        // Several periods pass; a cancelled timer must stay silent (bounded wait, expected to time out).
        XCTAssertEqual(fired.wait(timeout: .now() + 0.2), .timedOut)
        XCTAssertEqual(loopThread.sync { count.value! }, atCancel)
        loopThread.sync { timer.value = nil }
    }

    func testSignalIsDeliveredOnTheLoopThread() throws {
        let loopThread = try LoopThread()
        defer { loopThread.stop() }
        let delivered = DispatchSemaphore(value: 0)
        let onLoop = ResultBox<Bool>()
        let loop = loopThread.loop
        let watch = ResultBox<TransportSignal>()
        let loopThreadID = ResultBox<pthread_t>()
        try loopThread.sync { () -> Result<Void, any Error> in
            loopThreadID.value = pthread_self()
            return Result {
                watch.value = try TransportSignal(loop: loop, signal: SIGUSR2) {
                    onLoop.value = pthread_equal(pthread_self(), loopThreadID.value!) != 0
                    delivered.signal()
                }
            }
        }.get()
        // A real signal to this process: with the watch in place it is a loop event, not the default
        // action (which would end the test process).
        XCTAssertEqual(kill(getpid(), SIGUSR2), 0)
        XCTAssertEqual(delivered.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(loopThread.sync { onLoop.value }, true)
        // Delivered every time, not once.
        XCTAssertEqual(kill(getpid(), SIGUSR2), 0)
        XCTAssertEqual(delivered.wait(timeout: .now() + 5), .success)
        // Freed while another watch still holds the signal, so a stray SIGUSR2 cannot end the test run.
        let keeper = ResultBox<TransportSignal>()
        try loopThread.sync { () -> Result<Void, any Error> in
            defer { watch.value = nil }
            return Result { keeper.value = try TransportSignal(loop: loop, signal: SIGUSR2) {} }
        }.get()
        XCTAssertEqual(kill(getpid(), SIGUSR2), 0)
        XCTAssertEqual(delivered.wait(timeout: .now() + 0.2), .timedOut, "a freed watch is never called")
        loopThread.sync { keeper.value = nil }
    }

    func testWakeUpFromAnotherThreadRunsOnTheLoopAndIsInertOnceFreed() throws {
        let loopThread = try LoopThread()
        defer { loopThread.stop() }
        let woken = DispatchSemaphore(value: 0)
        let loop = loopThread.loop
        let wakeUp = ResultBox<TransportWakeUp>()
        let onLoop = ResultBox<Bool>()
        let loopThreadID = ResultBox<pthread_t>()
        let trigger = loopThread.sync { () -> TransportWakeUp.Trigger in
            loopThreadID.value = pthread_self()
            let made = TransportWakeUp(loop: loop) {
                onLoop.value = pthread_equal(pthread_self(), loopThreadID.value!) != 0
                woken.signal()
            }
            wakeUp.value = made
            return made.trigger
        }
        let done = DispatchSemaphore(value: 0)
        Thread {
            trigger.wake()
            done.signal()
        }.start()
        XCTAssertEqual(done.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(woken.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(loopThread.sync { onLoop.value }, true)
        loopThread.sync { wakeUp.value = nil }
        trigger.wake()   // the wake-up is gone: nothing runs, nothing is touched
        XCTAssertEqual(woken.wait(timeout: .now() + 0.2), .timedOut)
    }
}
