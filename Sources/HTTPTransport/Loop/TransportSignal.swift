import CLibevent

/// Delivers a POSIX signal (SIGTERM, SIGHUP, ...) to a handler on the loop's thread, every time it
/// arrives, for as long as the watcher lives. Loop thread only.
///
/// libevent installs the process-wide handler and turns the signal into a loop event, so the handler runs
/// as an ordinary callback: it may touch loop-confined state, which a real signal handler never may.
/// Signals that arrive together may be reported once. While any watcher for a signal lives, the signal's
/// default action (often: end the process) does not happen; freeing the last one restores it.
public final class TransportSignal {
    public let signal: Int32
    private var event: OpaquePointer?
    private let handler: () -> Void
    /// The loop must outlive the event (see `TransportTimer`).
    private let loop: TransportLoop

    public struct WatchError: Error, CustomStringConvertible {
        public let description: String
    }

    /// Starts watching at once. The handler should hold its owner weakly or unowned.
    public init(loop: TransportLoop, signal: Int32, handler: @escaping () -> Void) throws(WatchError) {
        self.signal = signal
        self.handler = handler
        self.loop = loop
        guard let event = event_new(loop.base, signal, Int16(EV_SIGNAL | EV_PERSIST), transportSignalTrampoline,
                                    Unmanaged.passUnretained(self).toOpaque()) else {
            throw WatchError(description: "cannot watch signal \(signal)")
        }
        guard event_add(event, nil) == 0 else {
            event_free(event)
            throw WatchError(description: "cannot watch signal \(signal)")
        }
        self.event = event
    }

    func fire() { handler() }

    deinit {
        if let event { event_free(event) }
    }
}

let transportSignalTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let watcher = Unmanaged<TransportSignal>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(watcher) { watcher.fire() }
}
