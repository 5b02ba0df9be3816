import HTTPTransport

/// A timer on the event loop that calls a Swift closure: once per `schedule(after:)`, or every interval
/// (`repeating`), or on the loop's next pass (`activate`).
///
/// The owner keeps the `LoopEvent`; the closure should capture its owner weakly or unowned. Freeing the
/// `LoopEvent` cancels it, so it can never fire into a released object.
final class LoopEvent {
    private let timer: TransportTimer

    /// A one-shot timer. The handler's argument is always 0 (it was libevent's "what fired" bits; the
    /// callers that still take it ignore it).
    init(loop: EventLoop, handler: @escaping (Int16) -> Void) {
        timer = TransportTimer(loop: loop.transport) { handler(0) }
    }

    init(repeatingOn loop: EventLoop, handler: @escaping () -> Void) {
        timer = TransportTimer(loop: loop.transport, repeats: true, handler: handler)
    }

    /// A timer that fires every `schedule(after:)` interval until freed.
    static func repeating(loop: EventLoop, handler: @escaping () -> Void) -> LoopEvent {
        LoopEvent(repeatingOn: loop, handler: handler)
    }

    /// Arms the timer (a pending expiry is replaced).
    func schedule(after seconds: Double) {
        timer.schedule(after: TimerDuration.clamped(seconds))
    }

    /// Runs the handler on the loop's next pass (safe from within other callbacks, never inside this call).
    func activate() {
        timer.schedule(after: 0)
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
