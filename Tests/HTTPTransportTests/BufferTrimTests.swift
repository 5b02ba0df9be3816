import Foundation
@testable import HTTPTransport
import XCTest

final class BufferTrimTests: XCTestCase {
    /// A burst's buffers are given back once the loop is quiet; while buffers are still being taken they
    /// stay (a steady load never frees and reallocates them).
    func testQuietPoolGivesItsBuffersBackAndABusyOneKeepsThem() throws {
        let loopThread = try LoopThread()
        defer { loopThread.stop() }
        let loop = loopThread.loop
        let box = ResultBox<(BufferPool, BufferTrim)>()
        loopThread.sync {
            let pool = BufferPool(size: 1024, maxFree: 4)
            let trim = BufferTrim(loop: loop, pool: pool, quietSeconds: 0.2)
            pool.onFirstKept = { trim.poolStartedKeeping() }
            pool.give(pool.take(1024), 1024)
            pool.give(pool.take(1024), 1024)
            box.value = (pool, trim)
        }
        // Busy: a buffer taken and given back every 20 ms for 0.6 s, three quiet spells' worth.
        for _ in 0..<30 {
            loopThread.sync { let pool = box.value!.0; pool.give(pool.take(1024), 1024) }
            usleep(20_000)
        }
        XCTAssertTrue(loopThread.sync { box.value!.0.keepsFreeBuffers }, "a busy pool keeps its buffers")
        // Quiet: bounded wait for the trim.
        let deadline = Date() + 5
        while loopThread.sync({ box.value!.0.keepsFreeBuffers }), Date() < deadline { usleep(20_000) }
        XCTAssertFalse(loopThread.sync { box.value!.0.keepsFreeBuffers }, "a quiet pool gave its buffers back")
        loopThread.sync { box.value = nil }
    }
}
