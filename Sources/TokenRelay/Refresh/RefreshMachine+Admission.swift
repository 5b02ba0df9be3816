import FoundationEssentials
import Glibc

/// A request arrives and a 401 comes back: admission, the 401 decision, the storm guard and a forced refresh.
/// Part of `RefreshMachine` (RefreshMachine.swift holds its state and reads in cycle order).
extension RefreshMachine {
    // MARK: - 1. A request arrives

    mutating func admit(now: Instant) -> (Admission, [Action]) {
        // Hold-off: a dead token cannot be replaced yet; an answer beats a wait longer than the hold.
        if let retryAfter = holdOffRetryAfter(now), tokenNeedsReplacing(now) { return (.unavailable(retryAfter: retryAfter), drain()) }
        // Shared store unreachable: a dead token cannot be replaced by this relay alone (`storeUnreachable`).
        if storeOutage != nil, tokenNeedsReplacing(now) { return (.unavailable(retryAfter: Self.storeOutageRetryAfter), drain()) }
        // No token yet (a grant that fetches its own, whose first fetch failed): fetch one, hold meanwhile.
        if tokens.accessToken.isEmpty, case .idle = phase { startCycle(.reactive, .noToken, now) }
        switch phase {
        case .idle, .stormPaused: return (.send(generation: generation), drain())
        // During a proactive cycle the current token still works: requests keep flowing.
        case .refreshing(let cycle) where cycle.mode == .proactive: return (.send(generation: generation), drain())
        // During a reactive one the token is dead: spending it would only earn another 401.
        case .refreshing: return (.hold, drain())
        case .loginRequired: return (.loginRequired, drain())
        }
    }

    /// The generation every request arriving now is sent with, when that answer does not depend on when
    /// it arrives: a token is in service, no hold-off and no store outage can turn a request away (those
    /// look at the clock), and no reactive cycle holds requests. `admit` then answers `.send` with this
    /// generation and emits nothing, so a driver may answer arrivals from this value until the machine
    /// next changes (a clock-driven change, an expiry or a hold-off's end, reaches it as a timer event).
    /// nil: ask `admit`.
    var timeIndependentAdmission: UInt64? {
        guard holdOff == nil, storeOutage == nil, !tokens.accessToken.isEmpty else { return nil }
        switch phase {
        case .idle, .stormPaused: return generation
        case .refreshing(let cycle) where cycle.mode == .proactive: return generation
        case .refreshing, .loginRequired: return nil
        }
    }

    // MARK: - 2. A 401 comes back

    mutating func unauthorized(sentGeneration: UInt64, now: Instant) -> (UnauthorizedDecision, [Action]) {
        switch phase {
        case .loginRequired, .stormPaused: return (.passThrough, drain())
        default: break
        }
        // Stale generation: the request left with an older token, which says nothing against the current
        // one. Refreshing on it would burn a refresh token for nothing; replay at once.
        if sentGeneration < generation { return (.replay, drain()) }
        // Stopped: no cycle starts, so a hold would only wait out `hold_seconds` (a request whose 401 came
        // after SIGTERM, or after a reload removed its identity). A cycle already running still releases.
        if stopped {
            if case .refreshing = phase { return (.hold, drain()) }
            return (.noRefresh, drain())
        }
        refusedGeneration = generation
        if storeOutage != nil {
            deadGeneration = generation
            return (.unavailable(retryAfter: Self.storeOutageRetryAfter), drain())
        }
        if let retryAfter = holdOffRetryAfter(now) {
            deadGeneration = generation
            return (.unavailable(retryAfter: retryAfter), drain())
        }
        // Coalescing: every 401 for the current generation joins the one cycle.
        if case .refreshing(var cycle) = phase {
            if cycle.mode == .proactive {
                // The token died before the proactive refresh finished: from now on requests wait.
                cycle.mode = .reactive
                phase = .refreshing(cycle)
                log(.info, "access token rejected during a proactive refresh; holding requests until it completes")
            }
            return (.hold, drain())
        }
        guard stormGuardAllowsRefresh(now) else { return (.passThrough, drain()) }
        startCycle(.reactive, .unauthorized, now)
        return (.hold, drain())
    }

    /// A refresh-triggering answer the client gets as it is, because its request cannot be sent again (a
    /// streamed upload whose body has gone). The token is as dead as for any 401, so the same rules apply
    /// (a stale generation says nothing; every such answer joins the one cycle; storm guard, hold-off and
    /// store outage as usual); the request itself is not held. Race it prevents: uploads refused one after
    /// another with nobody refreshing, until a request that could be replayed came along.
    mutating func unauthorizedNotReplayable(sentGeneration: UInt64, now: Instant) -> [Action] {
        unauthorized(sentGeneration: sentGeneration, now: now).1
    }

    /// Storm guard: at most `stormMaxRefreshes` 401-triggered refreshes per window. Race it prevents: a
    /// token endpoint that keeps issuing tokens the API rejects (wrong audience, clock skew) turning into
    /// an endless refresh loop. Only cycles that reach the token endpoint count (adopting another
    /// process's rotation is not a storm).
    mutating func stormGuardAllowsRefresh(_ now: Instant) -> Bool {
        reactiveRefreshTimes.removeAll { now.monotonic - $0 >= settings.stormWindowSeconds }
        guard reactiveRefreshTimes.count >= settings.stormMaxRefreshes else { return true }
        let reason = "\(reactiveRefreshTimes.count) refreshes within \(Int(settings.stormWindowSeconds)) s and the API still rejects the token"
        phase = .stormPaused(reason: reason)
        emit(.count(.stormGuardTrip))
        log(.error, "storm guard: refreshing paused; passing 401s through", ["reason": reason])
        let recoverAt = (reactiveRefreshTimes.first ?? now.monotonic) + settings.stormWindowSeconds
        emit(.schedule(.stormRecovery, at: max(now.monotonic + 0.01, recoverAt)))
        emit(.publish)
        return false
    }

    /// Operator-requested refresh (`POST /refresh`): clears the login latch and the storm guard, joins a
    /// running cycle. Returns an immediate outcome when it cannot start one.
    mutating func forceRefresh(now: Instant) -> (immediate: Outcome?, [Action]) {
        // Not even an operator may lift the hold-off: presenting the refresh token now is the very reuse
        // it prevents.
        if let holdOff, state != .refreshing { return (.unavailable(reason: holdOff.reason), drain()) }
        // Shutting down: nothing new starts, so nothing would ever answer the caller.
        if stopped, state != .refreshing { return (.unavailable(reason: "shutting down"), drain()) }
        // Tokens renewed a moment ago and nobody refused them since: that renewal is the answer.
        if case .idle = phase, !isAccessTokenKnownDead, now.monotonic - lastRenewalAt < Self.forcedRefreshReuseSeconds {
            log(.info, "forced refresh joined the renewal just made", ["generation": "\(generation)"])
            return (.renewed(generation: generation), drain())
        }
        switch phase {
        case .loginRequired, .stormPaused: clearLatches(now)
        default: break
        }
        startCycle(.reactive, .forced, now)
        return (nil, drain())
    }
}
