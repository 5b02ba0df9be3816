import CLibevent
import Glibc

/// A timer on a loop, for deadlines above the transport (hold limits, waiter timeouts, retries, periodic
/// checks) without importing libevent there. Rescheduling replaces the pending expiry; `cancel` and
/// deinit make sure the handler never runs afterwards. Loop thread only.
///
/// A repeating timer fires every `schedule(after:)` interval until cancelled or freed; libevent re-arms
/// it before the handler runs, so a slow handler does not stretch the period.
public final class TransportTimer {
    private var event: OpaquePointer?
    private let handler: () -> Void
    public let repeats: Bool
    public private(set) var isScheduled = false
    /// The loop must outlive the event: `event_free` after `event_base_free` is a use-after-free, and the
    /// order in which an owner's properties are released is not ours to choose.
    private let loop: TransportLoop

    /// The handler should hold its owner weakly: the owner normally owns the timer.
    public init(loop: TransportLoop, repeats: Bool = false, handler: @escaping () -> Void) {
        self.handler = handler
        self.repeats = repeats
        self.loop = loop
        event = event_new(loop.base, -1, repeats ? Int16(EV_PERSIST) : 0, transportTimerTrampoline, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Fires after `seconds` (negative, NaN or huge values are clamped to 0 ... 30 days: a deadline
    /// computed from outside data must not trap or wrap); a repeating timer then every `seconds`.
    /// 0 runs the handler on the loop's next pass, never inside this call.
    public func schedule(after seconds: Double) {
        guard let event else { return }
        var tv = clampedTimeval(seconds)
        event_add(event, &tv)
        isScheduled = true
    }

    public func cancel() {
        guard let event, isScheduled else { return }
        event_del(event)
        isScheduled = false
    }

    func fire() {
        if !repeats { isScheduled = false }
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
