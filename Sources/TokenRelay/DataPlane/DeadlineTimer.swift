import HTTPTransport

/// A deadline of one exchange (`RequestLifecycle.Timer`), on a timer the exchange borrowed from its
/// client session. Sessions keep their exchanges' timers for the next exchange: a keep-alive client
/// costs a timer per connection, not a timer object, a closure and a libevent event per request.
final class DeadlineTimer {
    /// Set while lent. Unowned(unsafe): an exchange gives its timers back, cancelled, in `finish`, which
    /// runs before it can be freed (it retains itself until then); a returned timer is never armed.
    unowned(unsafe) var exchange: (any DeadlineTimerOwner)?
    var kind = RequestLifecycle.Timer.responseHead
    /// The next spare timer of the session while this one is not lent (`ClientSession.lendDeadlineTimer`).
    var nextSpare: DeadlineTimer?
    private var timer: TransportTimer?

    init(loop: TransportLoop) {
        timer = TransportTimer(loop: loop) { [unowned self] in
            exchange?.deadlinePassed(kind)
        }
    }

    func schedule(after seconds: Double) { timer?.schedule(after: seconds) }

    func cancel() { timer?.cancel() }
}

/// The exchange a deadline timer is lent to.
protocol DeadlineTimerOwner: AnyObject {
    func deadlinePassed(_ timer: RequestLifecycle.Timer)
}
