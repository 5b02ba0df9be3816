import CLibevent
import Glibc

/// One libevent `event_base` and its asynchronous DNS resolver, driven by the thread that calls `run()`.
/// Every connection, listener, timer and name lookup of the transport belongs to one loop and is used only
/// on its thread; `wake()` is the one call that is safe from any thread.
///
/// tokenrelay runs everything mutable (the refresh coordinator, the token client, Redis, admin) on one
/// loop thread: its `EventLoop` wraps a `TransportLoop`.
public final class TransportLoop {
    /// The libevent base; nothing outside the transport reaches it.
    let base: OpaquePointer
    /// The loop's resolver (names never go through a blocking `getaddrinfo` on the loop thread).
    let dnsBase: OpaquePointer
    /// Read buffers shared by the loop's connections (loop thread only).
    let bufferPool = BufferPool()
    /// Empty pipes for spliced bodies (loop thread only).
    let splicePipes = SplicePipePool()
    /// Gives a burst's free read buffers back once the loop is quiet (made at the first kept buffer).
    private var bufferTrim: BufferTrim?
    private var wakeEvent: OpaquePointer?
    private var wakeHandler: (() -> Void)?

    public struct StartError: Error, CustomStringConvertible {
        public let description: String
    }

    public init() throws(StartError) {
        // Must precede every event_base_new so that event_active from another thread is safe; a peer that
        // closes a socket we write to must be an EPIPE, not a process-killing signal.
        evthread_use_pthreads()
        signal(SIGPIPE, SIG_IGN)
        guard let base = event_base_new() else { throw StartError(description: "event_base_new failed") }
        // If the system's resolver configuration cannot be read, an empty resolver still answers IP
        // literals and makes names fail fast instead of blocking.
        guard let dns = evdns_base_new(base, EVDNS_BASE_INITIALIZE_NAMESERVERS) ?? evdns_base_new(base, 0) else {
            event_base_free(base)
            throw StartError(description: "evdns_base_new failed")
        }
        self.base = base
        self.dnsBase = dns
        bufferPool.onFirstKept = { [unowned self] in
            if bufferTrim == nil { bufferTrim = BufferTrim(loop: self, pool: bufferPool) }
            bufferTrim?.poolStartedKeeping()
        }
    }

    /// Runs until `stop()`, also while nothing is registered (a loop waiting for work posted via `wake`).
    public func run() {
        event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY)
    }

    /// Runs until `stop()` or until nothing is registered any more. The resolver keeps its nameserver
    /// sockets registered, so in practice this ends with `stop()`; it differs from `run()` only on a
    /// loop whose resolver found no nameservers.
    public func runUntilIdle() {
        event_base_dispatch(base)
    }

    /// Ends `run()` after the current callbacks; call on the loop's thread (from another, use `wake`).
    public func stop() {
        event_base_loopexit(base, nil)
    }

    /// Sets what `wake()` runs on the loop's thread. Call on the loop's thread before other threads wake it.
    public func onWake(_ handler: @escaping () -> Void) {
        wakeHandler = handler
        if wakeEvent == nil {
            // Never added: an event without fd or timeout is only ever made active by event_active.
            wakeEvent = event_new(base, -1, Int16(EV_PERSIST), transportWakeTrampoline, Unmanaged.passUnretained(self).toOpaque())
        }
    }

    /// Makes the loop run the `onWake` handler soon; safe from any thread.
    public func wake() {
        if let wakeEvent { event_active(wakeEvent, Int32(EV_TIMEOUT), 0) }
    }

    func fireWake() { wakeHandler?() }

    deinit {
        if let wakeEvent { event_free(wakeEvent) }
        // Lookups still in flight are dropped without their callbacks; a connection keeps its loop alive,
        // so none of them can belong to a live connection.
        evdns_base_free(dnsBase, 0)
        event_base_free(base)
    }
}

/// Lets a loop be handed to the thread that runs it (the only cross-thread use is `wake()`).
public struct TransportLoopHandle: @unchecked Sendable {
    public let loop: TransportLoop
    public init(_ loop: TransportLoop) { self.loop = loop }
}

let transportWakeTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let loop = Unmanaged<TransportLoop>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(loop) { loop.fireWake() }
}
