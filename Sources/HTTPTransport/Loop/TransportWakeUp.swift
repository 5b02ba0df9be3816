import CLibevent
import Synchronization

/// A handler on the loop's thread that any thread may trigger: how work done on a helper thread (a
/// blocking write, a contended lock) reports back to the loop that owns the state it concerns.
///
/// Create, hold and free it on the loop's thread; hand `trigger` to the other thread. A trigger that
/// outlives its wake-up does nothing: the event is freed and checked under one lock, so a helper thread
/// that calls `wake()` while the loop frees the wake-up can never touch a freed event. Triggers that
/// arrive before the handler has run may be reported once.
public final class TransportWakeUp {
    private let cell: WakeCell
    private let handler: () -> Void
    /// The loop must outlive the event (see `TransportTimer`).
    private let loop: TransportLoop

    /// The handler should hold its owner weakly or unowned.
    public init(loop: TransportLoop, handler: @escaping () -> Void) {
        self.handler = handler
        self.loop = loop
        cell = WakeCell()
        // Never added: an event without fd or timeout runs only when made active.
        let event = event_new(loop.base, -1, 0, transportWakeUpTrampoline, Unmanaged.passUnretained(self).toOpaque())
        cell.event.withLock { $0 = event.map(EventPointer.init) }
    }

    /// What another thread calls to run the handler on the loop soon.
    public var trigger: Trigger { Trigger(cell: cell) }

    /// Safe to copy to, and call from, any thread.
    public struct Trigger: Sendable {
        fileprivate let cell: WakeCell

        public func wake() {
            // libevent's pthread locking (enabled by TransportLoop) makes event_active safe off the loop thread.
            cell.event.withLock { pointer in
                if let pointer { event_active(pointer.raw, Int32(EV_TIMEOUT), 0) }
            }
        }
    }

    func fire() { handler() }

    deinit {
        cell.event.withLock { pointer in
            if let pointer { event_free(pointer.raw) }
            pointer = nil
        }
    }
}

/// The wake-up's event, shared with its triggers; nil once freed.
final class WakeCell: Sendable {
    let event = Mutex<EventPointer?>(nil)
}

/// An `event*` that crosses threads only to be made active or freed under `WakeCell`'s lock.
struct EventPointer: @unchecked Sendable {
    let raw: OpaquePointer
}

let transportWakeUpTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let wakeUp = Unmanaged<TransportWakeUp>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(wakeUp) { wakeUp.fire() }
}
