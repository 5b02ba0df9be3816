import CLibevent
import Glibc
import HTTPTransport

/// tokenrelay's one libevent `event_base` and its asynchronous DNS resolver, driven by the thread that
/// calls `run()`: HTTPTransport's `TransportLoop`, which owns both, seen from the evhttp bridge.
///
/// Everything mutable in tokenrelay (exchanges, the token state, the upstream pool) is confined to this
/// loop's thread, so none of it needs a lock, and the transport's connections run on the same base. Nothing
/// on the loop may block: DNS goes through `evdns`, never `getaddrinfo` (evhttp resolves synchronously when
/// given no DNS base).
final class EventLoop {
    let transport: TransportLoop
    let base: OpaquePointer
    let dns: OpaquePointer

    struct StartError: Error, CustomStringConvertible { let description: String }

    init() throws {
        do {
            transport = try TransportLoop()
        } catch {
            throw StartError(description: error.description)
        }
        base = transport.base
        dns = transport.dnsBase
    }

    /// Runs until `stop()` or until no event is left.
    func run() {
        event_base_dispatch(base)
    }

    func stop() {
        event_base_loopexit(base, nil)
    }

    /// Monotonic seconds, for durations and deadlines that must not jump with the wall clock.
    static var monotonicNow: Double {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1_000_000_000
    }
}
