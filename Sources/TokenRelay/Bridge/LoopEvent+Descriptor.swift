import CLibevent
import Glibc
import HTTPTransport

// The libevent-shaped `LoopEvent` the evhttp engine (a client hang-up watch) and the demo's evhttp
// traffic generator still construct. It goes with them; everything else uses the transport's timers.

extension LoopEvent {
    /// - Parameters:
    ///   - fd: the descriptor to watch, or -1 for a timer.
    ///   - events: `EV_READ`, `EV_CLOSED`, `EV_PERSIST` as libevent defines them.
    convenience init(loop: EventLoop, fd: Int32 = -1, events: Int32, handler: @escaping (Int16) -> Void) {
        if fd < 0, events == Int32(EV_PERSIST) {
            self.init(source: TransportTimer(loop: loop.transport, repeats: true) { handler(0) })
            return
        }
        self.init(source: RawLoopEvent(loop: loop, fd: fd, events: events, handler: handler))
    }
}

/// A libevent `event` calling its `LoopEvent`'s handler. It keeps its loop alive: `event_free` on an
/// `event_base` that was freed first is a use-after-free.
final class RawLoopEvent: LoopEventSource {
    private var event: OpaquePointer?
    private let loop: EventLoop
    /// Held here, not reached through the `LoopEvent`: the trampoline keeps this object alive while the
    /// handler runs, and the handler may free the `LoopEvent`.
    private let handler: (Int16) -> Void

    init(loop: EventLoop, fd: Int32, events: Int32, handler: @escaping (Int16) -> Void) {
        self.loop = loop
        self.handler = handler
        event = event_new(loop.base, fd, Int16(truncatingIfNeeded: events), loopEventTrampoline, unretainedContext(self))
    }

    func fire(_ what: Int16) { handler(what) }

    func arm(after seconds: Double?) {
        guard let event else { return }
        if let seconds {
            var tv = timeval(seconds: seconds)
            event_add(event, &tv)
        } else {
            event_add(event, nil)
        }
    }

    func fireSoon() {
        guard let event else { return }
        event_active(event, Int32(EV_TIMEOUT), 0)
    }

    deinit {
        if let event { event_free(event) }
    }
}

extension timeval {
    /// For libevent calls in the evhttp bridge: clamped (`TimerDuration`), so no Double can trap here.
    init(seconds: Double) {
        let bounded = TimerDuration.clamped(seconds)
        let whole = bounded.rounded(.down)
        self.init(tv_sec: Int(whole), tv_usec: Int((bounded - whole) * 1_000_000))
    }
}
