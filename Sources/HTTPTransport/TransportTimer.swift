import CLibevent
import Glibc

/// A one-shot timer on a loop, for deadlines above the transport (hold limits, waiter timeouts, retries)
/// without importing libevent there. Rescheduling replaces the pending expiry; `cancel` and deinit make
/// sure the handler never runs afterwards. Loop thread only.
public final class TransportTimer {
    private var event: OpaquePointer?
    private let handler: () -> Void
    public private(set) var isScheduled = false

    /// The handler should hold its owner weakly: the owner normally owns the timer.
    public init(loop: TransportLoop, handler: @escaping () -> Void) {
        self.handler = handler
        event = event_new(loop.base, -1, 0, transportTimerTrampoline, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Fires once after `seconds` (negative, NaN or huge values are clamped to 0 ... 30 days: a deadline
    /// computed from outside data must not trap or wrap).
    public func schedule(after seconds: Double) {
        guard let event else { return }
        let clamped = seconds.isFinite ? min(max(seconds, 0), 30 * 24 * 3600) : 0
        let whole = clamped.rounded(.down)
        var tv = timeval(tv_sec: Int(whole), tv_usec: Int((clamped - whole) * 1_000_000))
        event_add(event, &tv)
        isScheduled = true
    }

    public func cancel() {
        guard let event, isScheduled else { return }
        event_del(event)
        isScheduled = false
    }

    func fire() {
        isScheduled = false
        handler()
    }

    deinit {
        if let event { event_free(event) }
    }
}

let transportTimerTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let timer = Unmanaged<TransportTimer>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(timer) { timer.fire() }
}
