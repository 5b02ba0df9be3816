import CLibevent
import Glibc

// libevent-flavoured spellings that the evhttp clients (token endpoint, demo traffic, login) still use;
// they go with those clients.

extension LoopEvent {
    /// A timer from libevent's flags: repeating with `EV_PERSIST`, else one-shot.
    convenience init(loop: EventLoop, events: Int32, handler: @escaping (Int16) -> Void) {
        if events & Int32(EV_PERSIST) != 0 {
            self.init(repeatingOn: loop) { handler(0) }
        } else {
            self.init(loop: loop, handler: handler)
        }
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
