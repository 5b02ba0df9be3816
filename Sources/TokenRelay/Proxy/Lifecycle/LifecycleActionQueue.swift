/// Runs a request's actions in the order the machine gave them, for the driver (`RelayedExchange`), which
/// keeps it as a stored value (no object per request).
///
/// An action may feed the machine another event (a refused hold, the refresh rules' answer, a connection
/// granted at once); the actions that event yields queue behind the ones still pending instead of running
/// inside the current one, so a driver never acts on a step the machine has already left. Nothing runs
/// after `finish`. The driver's loop:
///
/// ```
/// guard let actions = queue.begin(actions) else { return }   // queued behind the running batch
/// performEach(actions)                                        // each action that queue.admits(action)
/// while let batch = queue.next() { performEach(batch) }
/// ```
struct LifecycleActionQueue {
    private var pending = RequestLifecycle.ActionList()
    private var running = false
    private(set) var isFinished = false

    /// The actions for the caller to run now; nil when a batch is running: they wait behind it. Taken, not
    /// copied (a list is several actions long, and copying one retains what each action carries).
    mutating func begin(_ actions: consuming RequestLifecycle.ActionList) -> RequestLifecycle.ActionList? {
        guard running else {
            running = true
            return actions
        }
        // Usually nothing waits yet: the list is taken whole.
        if pending.isEmpty { pending = actions } else { pending += actions }
        return nil
    }

    /// Whether to perform `action` (nothing after `finish`); marks the queue finished at `finish`.
    mutating func admits(_ action: RequestLifecycle.Action) -> Bool {
        guard !isFinished else { return false }
        if case .finish = action { isFinished = true }
        return true
    }

    /// The next batch queued meanwhile, if any; at the end the queue is idle again.
    mutating func next() -> RequestLifecycle.ActionList? {
        guard !pending.isEmpty else {
            running = false
            return nil
        }
        return pending.take()
    }
}
