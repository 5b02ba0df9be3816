import CLibevent

/// A libevent `event` (timer, signal, fd readiness, or manual wake-up) that calls a Swift closure.
///
/// The owner keeps the `LoopEvent`; the closure should capture its owner weakly or unowned. Freeing the
/// `LoopEvent` (deinit) deletes the event, so it can never fire into a released object. It keeps its
/// loop alive: `event_free` on an `event_base` that was freed first is a use-after-free, and the order
/// in which Swift releases an owner's properties at shutdown is not ours to choose.
final class LoopEvent {
    private var event: OpaquePointer? = nil
    private let handler: (Int16) -> Void
    private let loop: EventLoop

    /// - Parameters:
    ///   - fd: the descriptor or signal number to watch, or -1 for a pure timer / manual event.
    ///   - events: `EV_TIMEOUT`, `EV_READ`, `EV_CLOSED`, `EV_SIGNAL`, `EV_PERSIST` as libevent defines them.
    init(loop: EventLoop, fd: Int32 = -1, events: Int32 = 0, handler: @escaping (Int16) -> Void) {
        self.handler = handler
        self.loop = loop
        event = event_new(loop.base, fd, Int16(truncatingIfNeeded: events), loopEventTrampoline, unretainedContext(self))
    }

    func fire(_ what: Int16) { handler(what) }

    /// A timer that fires every `schedule(after:)` interval until freed.
    static func repeating(loop: EventLoop, handler: @escaping () -> Void) -> LoopEvent {
        LoopEvent(loop: loop, events: Int32(EV_PERSIST)) { _ in handler() }
    }

    /// Arms the event; `after` nil means "no timeout" (fd and signal events wait for their condition).
    func schedule(after seconds: Double? = nil) {
        guard let event else { return }
        if let seconds {
            var tv = timeval(seconds: seconds)
            event_add(event, &tv)
        } else {
            event_add(event, nil)
        }
    }

    /// Runs the handler on the next loop iteration (safe from within other callbacks).
    func activate() {
        guard let event else { return }
        event_active(event, Int32(EV_TIMEOUT), 0)
    }

    deinit {
        if let event { event_free(event) }
    }
}

/// What every timer and timeout handed to libevent goes through.
enum TimerDuration {
    /// The longest timer libevent is ever given. Callers clamp durations from outside where they read
    /// them; this is the last line, so that no Double reaching a timer can trap in the conversion.
    static let longestSeconds: Double = 10 * 366 * 86_400

    static func clamped(_ seconds: Double) -> Double {
        seconds.isNaN ? 0 : min(max(seconds, 0), longestSeconds)
    }
}

extension timeval {
    init(seconds: Double) {
        let bounded = TimerDuration.clamped(seconds)
        let whole = bounded.rounded(.down)
        self.init(tv_sec: Int(whole), tv_usec: Int((bounded - whole) * 1_000_000))
    }
}
