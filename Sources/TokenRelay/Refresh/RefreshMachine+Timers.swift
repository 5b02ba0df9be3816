import FoundationEssentials
import Glibc

/// Proactive refresh, the machine's timers, and tokens rotated but not saved.
/// Part of `RefreshMachine` (RefreshMachine.swift holds its state and reads in cycle order).
extension RefreshMachine {
    // MARK: - 9. Proactive refresh

    /// Ahead of expiry by the skew (plus jitter that spreads a fleet that got its tokens together); at
    /// expiry and not before while the refresh token is in doubt (race it prevents: presenting a
    /// maybe-rotated refresh token early, when nothing needs it yet). Time-triggered cycles are spaced by
    /// `minimumCycleSpacing`.
    ///
    /// One refresh per lifetime, fleet-wide. Race it prevents: every relay that adopted a set plans its
    /// own refresh of it, and the earliest of N timers wins; when those timers can come before the one of
    /// the relay that got the set, N relays refresh more often than one (measured: 3 relays with 2-s
    /// tokens, 16-18 refreshes in 12 s where one makes 12). So a set refreshed here is planned as before
    /// (the skew, spread earlier by the jitter, spaced from the cycle's start), and an adopted one never
    /// sooner: the jitter spreads it later (from the skew to 0.8 skew before expiry), and the spacing
    /// counts from its adoption (but never past its expiry). The relay that got a set then refreshes
    /// it again, and the others take over only when it does not.
    mutating func scheduleProactiveRefresh(_ now: Instant) {
        emit(.cancel(.proactive))
        guard settings.proactive, !stopped, state != .loginRequired, let expiresAt = tokens.expiresAt, let lifetime else { return }
        let untilExpiry = expiresAt.timeIntervalSince(now.wall)
        var delay = untilExpiry
        if !refreshTokenInDoubt {
            let skew = TokenExpiry.skew(lifetime: lifetime, configured: settings.skewSeconds)
            delay -= obtainedHere || adoptedAt == nil ? skew + now.jitter * skew * 0.2 : skew - now.jitter * skew * 0.2
        }
        delay = max(delay, lastCycleStartedAt + Self.minimumCycleSpacing - now.monotonic)
        if let adoptedAt { delay = max(delay, min(adoptedAt + Self.minimumCycleSpacing - now.monotonic, untilExpiry)) }
        if delay <= 0 {
            // Already due: an expired token is useless, so requests wait for the new one; one inside the
            // skew still works meanwhile.
            proactiveMode = expiresAt > now.wall ? .proactive : .reactive
        } else {
            proactiveMode = refreshTokenInDoubt ? .reactive : .proactive
        }
        emit(.schedule(.proactive, at: now.monotonic + max(0, delay)))
    }

    // MARK: - 10. Timers

    mutating func timerFired(_ timer: Timer, now: Instant) -> [Action] {
        switch timer {
        case .attempt: attemptTimerFired(now)
        case .proactive:
            if case .idle = phase { startCycle(proactiveMode, proactiveMode == .proactive ? .expiring : .expired, now) }
        case .stormRecovery:
            if case .stormPaused = phase {
                clearLatches(now)
                log(.info, "storm guard: window passed; refreshing allowed again")
            }
        case .holdOff: holdOffEnded(now)
        case .saveRetry: retrySave(now)
        }
        return drain()
    }

    mutating func clearLatches(_ now: Instant) {
        phase = .idle
        emit(.cancel(.stormRecovery))
        reactiveRefreshTimes = []
        scheduleProactiveRefresh(now)
        emit(.publish)
    }

    // MARK: - 11. Unsaved tokens

    /// Rotated tokens that could not be written stay in service, visibly (`degradedReason`, the unsaved
    /// gauge), and the write is retried with backoff until it succeeds. Race it prevents: a restart (or
    /// another process) reading the burnt refresh token that is still on disk.
    mutating func markUnsaved(_ error: String, _ now: Instant) {
        emit(.count(.tokenFileWriteFailure))
        let failedWrites = (unsaved?.failedWrites ?? 0) + 1
        unsaved = Unsaved(error: error, failedWrites: failedWrites)
        if failedWrites == 1 {
            log(.critical, settings.sharedStore
                ? "could not write the refreshed tokens to the shared token store; only this relay (and its local cache, if configured) holds them; retrying the write"
                : "could not persist refreshed tokens; a restart now would need a new login; retrying the write", ["error": error])
        }
        let exponent = Double(min(failedWrites - 1, 20))
        let delay = min(max(settings.backoffSeconds, 0.05) * pow(2, exponent), Self.maximumSaveRetryDelay)
        emit(.schedule(.saveRetry, at: now.monotonic + delay))
        emit(.publish)
    }

    mutating func markSaved() {
        if let unsaved { log(.warning, settings.sharedStore ? "tokens saved to the shared token store after failed writes" : "tokens saved to the token file after failed writes", ["failed_writes": "\(unsaved.failedWrites)"]) }
        unsaved = nil
        emit(.cancel(.saveRetry))
        emit(.publish)
    }

    static func unreadableReason(_ read: StoreRead) -> String? {
        switch read {
        case .unreadable(let error), .sealedUnopened(let error): error
        default: nil
        }
    }

    /// A cycle under way writes newer tokens itself; otherwise the tokens in service are written again.
    mutating func retrySave(_ now: Instant) {
        guard let unsaved, !retryWriteInFlight else { return }
        if cycleWriteAwaitingRetry, case .refreshing(let cycle) = phase, case .persisting(let next, _, _, false) = cycle.step {
            cycleWriteAwaitingRetry = false
            log(.info, "retrying the shared token store write", ["failed_writes": "\(unsaved.failedWrites)"])
            emit(.persist(next))
            return
        }
        if case .refreshing = phase {
            emit(.schedule(.saveRetry, at: now.monotonic + max(settings.backoffSeconds, 0.05)))
            return
        }
        log(.info, settings.sharedStore ? "retrying the shared token store write" : "retrying the token file write",
            ["failed_writes": "\(unsaved.failedWrites)"])
        retryWriteInFlight = true
        emit(.persist(tokens))
    }

    /// Whether tokens in service are not in the store (the driver's last write at exit).
    var hasUnsavedTokens: Bool { unsaved != nil }

    mutating func savedAtExit() { unsaved = nil }

    /// The answer whose write was still under way when the loop stopped (a second signal, the drain's
    /// last grace): the driver writes it synchronously at exit. Race it prevents: the process ending
    /// while a helper thread writes, leaving the token file with the refresh token the answer burnt.
    var answerBeingSaved: TokenSet? {
        guard case .refreshing(let cycle) = phase, case .persisting(let next, _, _, _) = cycle.step else { return nil }
        return next
    }
}
