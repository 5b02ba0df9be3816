/// Runs a request's actions in the order the machine gave them, for the driver (`RelayedExchange`), which
/// keeps it as a stored value (no object per request).
///
/// An action may feed the machine another event (a refused hold, the refresh rules' answer, a connection
/// granted at once); the actions that event yields queue behind the ones still pending instead of running
/// inside the current one, so a driver never acts on a step the machine has already left. Nothing runs
/// after `finish`. The driver's loop:
///
/// ```
/// guard queue.begin() else {                    // a batch is running: this one waits behind it
///     var actions = actions
///     if queue.hasWaiting {
///         var waiting = queue.takeWaiting()
///         waiting += actions
///         swap(&waiting, &actions)
///     }
///     return queue.wait(&actions)
/// }
/// performEach(actions)                          // each action that queue.admits(action)
/// while let batch = queue.next() { performEach(batch) }
/// ```
///
/// Every method only moves lists, never copies or drops one: the driver adds a batch to the waiting
/// actions outside its access to the queue, and drops the list `wait` hands back there too. Dropping a list
/// releases its overflow array, a call the compiler cannot see through, so a list dropped inside an access
/// to the driver's stored queue would make it check every access to the queue at run time; with moves
/// alone it proves them exclusive when it compiles them.
struct LifecycleActionQueue {
    private var waiting = RequestLifecycle.ActionList()
    private var running = false
    private(set) var isFinished = false

    /// True: the caller runs its batch now, then each batch `next()` gives. False: a batch is running; the
    /// caller's actions wait behind it (`takeWaiting`, `wait`).
    mutating func begin() -> Bool {
        if running { return false }
        running = true
        return true
    }

    /// Whether actions wait to run behind the running batch.
    var hasWaiting: Bool { !waiting.isEmpty }

    /// The actions waiting to run, moved out (the queue holds none until `wait`).
    mutating func takeWaiting() -> RequestLifecycle.ActionList {
        waiting.take()
    }

    /// Moves `actions` in as the actions waiting to run; `actions` is left with the list it replaces (the
    /// empty one `takeWaiting` left), for the caller to drop.
    mutating func wait(_ actions: inout RequestLifecycle.ActionList) {
        swap(&waiting, &actions)
    }

    /// Whether to perform `action` (nothing after `finish`); marks the queue finished at `finish`.
    mutating func admits(_ action: RequestLifecycle.Action) -> Bool {
        guard !isFinished else { return false }
        if case .finish = action { isFinished = true }
        return true
    }

    /// The next batch queued meanwhile, if any; at the end the queue is idle again.
    mutating func next() -> RequestLifecycle.ActionList? {
        guard !waiting.isEmpty else {
            running = false
            return nil
        }
        return waiting.take()
    }
}
