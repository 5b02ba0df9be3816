import HTTPTransport

/// A timer on the event loop that calls a Swift closure: once per `schedule(after:)`, or every interval
/// (`repeating`), or on the loop's next pass (`activate`).
///
/// The owner keeps the `LoopEvent`; the closure should capture its owner weakly or unowned. Freeing the
/// `LoopEvent` cancels it, so it can never fire into a released object.
final class LoopEvent {
    private let source: any LoopEventSource

    /// A one-shot timer. The handler's argument says what fired: 0 for a timer (the evhttp bridge's
    /// descriptor watch, `LoopEvent+Descriptor.swift`, passes libevent's bits).
    init(loop: EventLoop, handler: @escaping (Int16) -> Void) {
        source = TransportTimer(loop: loop.transport) { handler(0) }
    }

    init(source: any LoopEventSource) {
        self.source = source
    }

    /// A timer that fires every `schedule(after:)` interval until freed.
    static func repeating(loop: EventLoop, handler: @escaping () -> Void) -> LoopEvent {
        LoopEvent(source: TransportTimer(loop: loop.transport, repeats: true, handler: handler))
    }

    /// Arms the event; `after` nil means "no timeout" (a descriptor watch waits for its condition).
    func schedule(after seconds: Double? = nil) {
        source.arm(after: seconds.map(TimerDuration.clamped))
    }

    /// Runs the handler on the loop's next pass (safe from within other callbacks, never inside this call).
    func activate() {
        source.fireSoon()
    }
}

/// What a `LoopEvent` runs on: a transport timer, or (until the evhttp engine goes) a libevent event.
protocol LoopEventSource: AnyObject {
    func arm(after seconds: Double?)
    func fireSoon()
}

extension TransportTimer: LoopEventSource {
    func arm(after seconds: Double?) {
        // A timer with no timeout would never fire; libevent treated it the same way (pending, never due).
        guard let seconds else { return }
        schedule(after: seconds)
    }

    func fireSoon() {
        schedule(after: 0)
    }
}

/// What every timer and timeout handed to the loop goes through.
enum TimerDuration {
    /// The longest timer the loop is ever given. Callers clamp durations from outside where they read
    /// them; this is the last line, so that no Double reaching a timer can trap in the conversion.
    static let longestSeconds: Double = 10 * 366 * 86_400

    static func clamped(_ seconds: Double) -> Double {
        seconds.isNaN ? 0 : min(max(seconds, 0), longestSeconds)
    }
}
