import FoundationEssentials
import Synchronization

/// Runs one blocking call (a write with fsync, a contended flock) on a helper thread and hands its
/// result back on the event loop, so the loop never waits on a disk or another process.
///
/// The helper thread touches only the work closure's own (Sendable) captures and the result box. It
/// wakes the loop with `event_active`, the one libevent call that is safe from another thread
/// (`EventLoop` enables libevent's pthread support). The job keeps itself alive until it has delivered.
final class OffLoopWork<Output: Sendable> {
    private let box = ResultBox<Output>()
    private var wakeUp: LoopEvent?
    private var completion: ((Output) -> Void)?
    private var selfRetain: OffLoopWork?

    private init() {}

    /// Runs `work` on a new thread; `completion` runs later on `loop`'s thread, never inside this call.
    static func run(on loop: EventLoop, _ work: @escaping @Sendable () -> Output, then completion: @escaping (Output) -> Void) {
        let job = OffLoopWork()
        job.selfRetain = job
        job.completion = completion
        let wakeUp = LoopEvent(loop: loop) { [unowned job] _ in job.deliver() }
        job.wakeUp = wakeUp
        let box = job.box
        let event = CrossThreadEvent(event: wakeUp)
        DetachedThread.start {
            let output = work()
            box.value.withLock { $0 = output }
            event.event.activate()
        }
    }

    private func deliver() {
        guard let output = box.value.withLock({ $0 }) else { return }
        let completion = self.completion
        self.completion = nil
        wakeUp = nil
        selfRetain = nil  // the trampoline keeps the LoopEvent, and `completion` its captures, alive until we return
        completion?(output)
    }
}

/// `event_active` is the one libevent call that may come from another thread; this wrapper says so.
/// The reference is unowned on purpose: if the helper thread held the last strong reference, the event
/// would be freed on that thread, racing the loop (or after the loop is gone). The job keeps the event
/// alive until `deliver`, which cannot run before `activate` has been called.
private struct CrossThreadEvent: @unchecked Sendable {
    unowned(unsafe) let event: LoopEvent
}

/// What the helper thread produced, read on the loop after the wake-up.
private final class ResultBox<Output: Sendable>: Sendable {
    let value = Mutex<Output?>(nil)
}
