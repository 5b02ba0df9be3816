import Glibc
import HTTPTransport

/// tokenrelay's one event loop, driven by the thread that calls `run()`: HTTPTransport's `TransportLoop`
/// under the name the rest of tokenrelay knows it by.
///
/// Everything mutable in tokenrelay (exchanges, the token state, the upstream pool) is confined to this
/// loop's thread, so none of it needs a lock. Nothing on the loop may block: blocking work goes through
/// `OffLoopWork`, names through the transport's asynchronous resolver.
final class EventLoop {
    let transport: TransportLoop

    struct StartError: Error, CustomStringConvertible { let description: String }

    init() throws {
        do {
            transport = try TransportLoop()
        } catch {
            throw StartError(description: error.description)
        }
    }

    /// Runs until `stop()` or until no event is left.
    func run() {
        transport.runUntilIdle()
    }

    func stop() {
        transport.stop()
    }

    /// Monotonic seconds, for durations and deadlines that must not jump with the wall clock.
    static var monotonicNow: Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1_000_000_000
    }
}
