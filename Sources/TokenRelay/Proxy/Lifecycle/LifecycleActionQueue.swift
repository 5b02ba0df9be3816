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
        pending += actions
        guard !running else { return }
        running = true
        while !pending.isEmpty {
            let action = pending.removeFirst()
            guard !isFinished else { continue }
            if case .finish = action { isFinished = true }
            perform(action)
        }
        running = false
    }
}
