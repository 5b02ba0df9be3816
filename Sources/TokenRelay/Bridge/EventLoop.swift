import CLibevent
import Glibc

/// One libevent `event_base` and its asynchronous DNS resolver, driven by the thread that calls `run()`.
///
/// Everything mutable in tokenrelay (exchanges, the token state, the upstream pool) is confined to this
/// loop's thread, so none of it needs a lock. Nothing on the loop may block: DNS goes through `evdns`,
/// never `getaddrinfo` (evhttp resolves synchronously when given no DNS base).
final class EventLoop {
    let base: OpaquePointer
    let dns: OpaquePointer

    struct StartError: Error, CustomStringConvertible { let description: String }

    init() throws {
        // Must precede every event_base_new (libevent thread.h), and a peer closing a socket we write to
        // must be an error return, not a process-killing signal.
        evthread_use_pthreads()
        signal(SIGPIPE, SIG_IGN)
        guard let base = event_base_new() else { throw StartError(description: "event_base_new failed") }
        self.base = base
        // With no DNS base evhttp would resolve with a blocking getaddrinfo on the loop. If the system's
        // resolver configuration cannot be read, an empty base still resolves IP literals and makes
        // names fail fast instead of blocking.
        guard let dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS) ?? evdns_base_new(base, 0) else {
            event_base_free(base)
            throw StartError(description: "evdns_base_new failed")
        }
        self.dns = dns
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

    deinit {
        evdns_base_free(dns, 0)
        event_base_free(base)
    }
}
