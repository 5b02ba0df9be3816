/// When a SIGHUP reload reads the config, and whether what it read may still be applied: a pure value
/// (events in, actions out), driven by `Relay+Reload` on the event loop.
///
/// Reading and checking the new config (the file, CA bundles, client certificates, the client secret)
/// blocks on files, so it runs off the loop; the loop keeps serving and applies the result when it comes
/// back. Rules, each with the race it prevents:
/// - At most one preparation runs at a time. Two running side by side could finish out of order, and the
///   older config would be applied after the newer one.
/// - A SIGHUP that arrives while one is being prepared is remembered (however many arrive, once); when the
///   preparation in progress comes back, its result is discarded and the config is read again. It may
///   have read the file before the edit that the later SIGHUP announced: applying it would put an older
///   config in service, and nothing would correct it.
/// - Once shutdown has begun, nothing is applied and nothing new is prepared: the drain runs with the
///   config it began with (listeners closing, held requests answered under the timeouts it announced).
/// - systemd hears `RELOADING=1` when a preparation starts and `READY=1` once, after the last one is
///   applied or refused, so `systemctl reload` returns when the newest config is in service. A repeated
///   preparation says `RELOADING=1` again with its own time, newer than the SIGHUP that asked for it. After
///   `STOPPING=1` nothing more is said.
struct ReloadSchedule: Equatable {
    enum Action: Equatable {
        /// Tell systemd a reload has begun.
        case notifyReloading
        /// Read and check the config off the loop; `prepared` brings the result back.
        case prepare
        /// Apply (or, if invalid, refuse with its one line) the result just prepared.
        case applyPrepared
        /// The result just prepared is older than a SIGHUP received meanwhile: drop it unseen.
        case discardSuperseded
        /// The result just prepared came back after shutdown began: drop it unseen.
        case discardShuttingDown
        /// Tell systemd the reload is over.
        case notifyReady
        /// A SIGHUP while a preparation runs: noted, it runs once more afterwards.
        case noteRequestedAgain
        /// A SIGHUP after shutdown began.
        case ignoreShuttingDown
    }

    private(set) var isPreparing = false
    private(set) var isRequestedAgain = false
    private(set) var isShuttingDown = false

    /// SIGHUP.
    mutating func signalled() -> [Action] {
        if isShuttingDown { return [.ignoreShuttingDown] }
        if isPreparing {
            isRequestedAgain = true
            return [.noteRequestedAgain]
        }
        isPreparing = true
        return [.notifyReloading, .prepare]
    }

    /// A preparation came back (valid or not).
    mutating func prepared() -> [Action] {
        isPreparing = false
        if isShuttingDown {
            isRequestedAgain = false
            return [.discardShuttingDown]
        }
        if isRequestedAgain {
            isRequestedAgain = false
            isPreparing = true
            return [.discardSuperseded, .notifyReloading, .prepare]
        }
        return [.applyPrepared, .notifyReady]
    }

    /// SIGTERM/SIGINT: the drain has begun.
    mutating func shutdownBegan() {
        isShuttingDown = true
    }
}
