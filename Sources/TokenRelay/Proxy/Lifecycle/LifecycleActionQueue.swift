/// Runs a request's actions in the order the machine gave them, for either engine's driver.
///
/// An action may feed the machine another event (a refused hold, the refresh rules' answer, a connection
/// granted at once); the actions that event yields queue behind the ones still pending instead of running
/// inside the current one, so a driver never acts on a step the machine has already left. Nothing runs
/// after `finish`.
final class LifecycleActionQueue {
    private var pending: [RequestLifecycle.Action] = []
    private var running = false
    private(set) var isFinished = false

    func run(_ actions: [RequestLifecycle.Action], perform: (RequestLifecycle.Action) -> Void) {
        guard !running else {
            // Usually nothing waits yet: the list is taken as it is, not copied.
            if pending.isEmpty { pending = actions } else { pending += actions }
            return
        }
        running = true
        // The outermost call works through its own batch in place, then through whatever the actions
        // queued meanwhile, batch by batch: the same order as one queue, without copying every action.
        var batch = actions
        while true {
            for action in batch {
                guard !isFinished else { continue }
                if case .finish = action { isFinished = true }
                perform(action)
            }
            if pending.isEmpty { break }
            batch = pending
            pending = []
        }
        running = false
    }
}
