import HTTPTransport
import Synchronization

/// Runs one blocking call (a write with fsync, a contended flock) on a helper thread and hands its
/// result back on the event loop, so the loop never waits on a disk or another process.
///
/// The helper thread touches only the work closure's own (Sendable) captures, the result box and the
/// wake-up's trigger, the one piece of the loop that is safe from another thread. The job keeps itself
/// alive until it has delivered.
final class OffLoopWork<Output: Sendable> {
    private let box = ResultBox<Output>()
    private var wakeUp: TransportWakeUp?
    private var completion: ((Output) -> Void)?
    private var selfRetain: OffLoopWork?

    private init() {}

    /// Runs `work` on a new thread; `completion` runs later on `loop`'s thread, never inside this call.
    static func run(on loop: EventLoop, _ work: @escaping @Sendable () -> Output, then completion: @escaping (Output) -> Void) {
        let job = OffLoopWork()
        job.selfRetain = job
        job.completion = completion
        let wakeUp = TransportWakeUp(loop: loop.transport) { [unowned job] in job.deliver() }
        job.wakeUp = wakeUp
        let box = job.box
        let trigger = wakeUp.trigger
        DetachedThread.start {
            let output = work()
            box.value.withLock { $0 = output }
            trigger.wake()
        }
    }

    private func deliver() {
        guard let output = box.value.withLock({ $0 }) else { return }
        let completion = self.completion
        self.completion = nil
        wakeUp = nil
        selfRetain = nil  // the trampoline keeps the wake-up, and `completion` its captures, alive until we return
        completion?(output)
    }
}

/// What the helper thread produced, read on the loop after the wake-up.
private final class ResultBox<Output: Sendable>: Sendable {
    let value = Mutex<Output?>(nil)
}
