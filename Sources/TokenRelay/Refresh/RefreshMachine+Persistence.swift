import FoundationEssentials
import Glibc

/// Persist before release, a shared store out of reach, and how a cycle ends (new tokens, give up, latch).
/// Part of `RefreshMachine` (RefreshMachine.swift holds its state and reads in cycle order).
extension RefreshMachine {
    // MARK: - 6. Persist before release

    /// Race it prevents: the old refresh token is burnt the moment the server answered; releasing held
    /// requests (or crashing) before the new one is on disk could lose the session. The cycle stays open
    /// meanwhile, so held requests stay held and no second cycle starts. One write at a time: an
    /// earlier retry's write finishes first, so older tokens can never land after newer ones.
    mutating func persist(_ next: TokenSet, lifetime: Double?, purpose: PersistPurpose, _ cycle: Cycle) {
        var cycle = cycle
        cycle.step = .persisting(next, lifetime: lifetime, purpose: purpose, queued: retryWriteInFlight)
        phase = .refreshing(cycle)
        if !retryWriteInFlight { emit(.persist(next)) }
    }

    mutating func persisted(now: Instant) -> [Action] {
        writeFinished(error: nil, now)
        return drain()
    }

    /// The shared store holds a newer version than the one this write was based on (its compare-and-set
    /// lost). Race it prevents: a stale writer (its lock expired, a paused process, an operator's import
    /// meanwhile) overwriting a newer rotation. The stale writer loses: what the store holds is adopted,
    /// and the cycle ends with it.
    mutating func persistConflicted(_ stored: StoreRead, now: Instant) -> [Action] {
        emit(.count(.storeConflict))
        switch stored {
        case .tokens(let newer) where isNewToUs(newer): break
        case .latched: break
        default:
            // What the store holds now is no newer than ours (a refresh token we already presented, our own
            // old tokens, nothing, or unreadable): our fresh tokens are the only live ones. Dropping them
            // would lose the session; they stay in service as unsaved and the write is retried on the
            // version just read (the driver bases the next compare-and-set on it).
            log(.warning, "the token store changed under our write but holds nothing newer; keeping our tokens and writing again")
            writeFinished(error: "the token store changed under our write (compare-and-set lost to an older token set)", now)
            return drain()
        }
        let isRetryWrite = retryWriteInFlight
        retryWriteInFlight = false
        guard isRetryWrite || { if case .refreshing(let c) = phase, case .persisting(_, _, _, false) = c.step { return true }; return false }() else {
            return drain()
        }
        if unsaved != nil {
            unsaved = nil
            emit(.cancel(.saveRetry))
        }
        log(.warning, "a newer token set was stored meanwhile; our write lost its compare-and-set and the stored one is adopted")
        if case .refreshing = phase { emit(.releaseLock) }
        switch stored {
        case .tokens(let newer) where isNewToUs(newer):
            adopt(newer, now)
            emit(.count(.adoptedRotation))
            endCycleOrRelease(now)
        case .latched(_, let reason):
            reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
        default: break
        }
        emit(.tokenEndpointIdle)
        return drain()
    }

    mutating func endCycleOrRelease(_ now: Instant) {
        if case .refreshing = phase {
            endCycle(.renewed(generation: generation), description: "adopted from the token store after a lost write", now)
        } else {
            emit(.publish)
            emit(.release(.renewed(generation: generation)))
        }
    }

    // MARK: - 15. A shared store out of reach

    /// The shared store (Redis) cannot be reached. Race it prevents: a relay refreshing on its own burns
    /// the refresh token for the whole fleet, which then presents it again. So nothing is refreshed: the
    /// access token in hand serves while it is not known dead; after that requests get 503 with
    /// `Retry-After` (`admit`, `unauthorized`). A cycle that has not reached the token server ends now
    /// (its held requests get the reason); one already at the token server finishes, and its write is
    /// retried until the store is back.
    mutating func storeUnreachable(_ reason: String, now: Instant) -> [Action] {
        let changed = storeOutage != reason
        storeOutage = reason
        if changed { log(.error, "token store unreachable; serving with the current access token while it lasts, no refresh", ["reason": reason]) }
        if case .refreshing(let cycle) = phase {
            switch cycle.step {
            case .waiting, .acquiringLock, .recordingInFlight:
                // Nothing has left yet (a record being written only holds the fleet off a while).
                emit(.releaseLock)
                giveUp(reason: "token store unreachable (\(reason)); no relay may refresh without it", now)
            case .exchanging, .persisting: break
            }
        }
        emit(.publish)
        return drain()
    }

    /// At start, before the shared store has answered: as unreachable, without the alarm.
    mutating func awaitStore(_ reason: String) {
        storeOutage = reason
    }

    /// Back: the store is read first (the fleet may have rotated meanwhile), then the proactive timer
    /// (or a cycle for a token that is missing or dead) takes over again.
    mutating func storeReachable(now: Instant) -> [Action] {
        guard storeOutage != nil else { return drain() }
        storeOutage = nil
        log(.info, "token store reachable again")
        // Rotated tokens we could not write go first, at once, not after the retry backoff. Race it
        // prevents: the lock we held runs out meanwhile and another relay, reading the old version under
        // its own lock, presents the refresh token our refresh already burnt.
        if unsaved != nil { retrySave(now) }
        readingStoreAfterOutage = true
        emit(.readStore)
        emit(.publish)
        return drain()
    }

    mutating func persistFailed(_ error: String, now: Instant) -> [Action] {
        writeFinished(error: error, now)
        return drain()
    }

    mutating func writeFinished(error: String?, _ now: Instant) {
        if retryWriteInFlight {
            retryWriteInFlight = false
            if let error { markUnsaved(error, now) } else { markSaved() }
            // The record of the exchange whose answer this saves names a refresh token no longer in the
            // file: stale, removed under the lock by the next cycle (not here: without the lock it could
            // be another process's record by now).
            // A cycle's write that queued behind it goes now, before anyone hears "idle".
            if case .refreshing(var cycle) = phase, case .persisting(let next, let lifetime, let purpose, true) = cycle.step {
                cycle.step = .persisting(next, lifetime: lifetime, purpose: purpose, queued: false)
                phase = .refreshing(cycle)
                emit(.persist(next))
            }
            emit(.tokenEndpointIdle)
            return
        }
        guard case .refreshing(let cycle) = phase, case .persisting(let next, let lifetime, let purpose, false) = cycle.step else { return }
        // A write of ours failed before this one (`unsaved`): the answer waited for the store.
        let waitedForTheStore = unsaved != nil
        cycleWriteAwaitingRetry = false
        if let error, settings.sharedStore, !stopped {
            // Persist before release, fleet form. Race it prevents: the fleet's other relays read the
            // store, not our memory; serving the new tokens before the store holds them lets another
            // relay (or this one restarted) present the refresh token this answer just burnt. So the
            // cycle stays open: held requests stay held until the store acknowledges (or their hold
            // timeout answers them 503 with Retry-After), and the same write is sent again with backoff
            // and at once when the store is back.
            markUnsaved(error, now)
            cycleWriteAwaitingRetry = true
            log(.warning, "held requests wait until the shared token store acknowledges the refreshed tokens", ["error": error])
            return
        }
        // Serving beats failing: the new tokens are used even if they could not be written, but the
        // state is loud (`markUnsaved`). The in-flight record goes once the answer is saved; while the
        // token file still holds the presented (burnt) refresh token, it keeps holding a restart off.
        if let error { markUnsaved(error, now) } else { markSaved(); removeInFlightRecord() }
        switch purpose {
        case .renewal:
            adoptedAt = nil
            obtainedHere = true
            adopt(next, lifetime: lifetime, now)
            emit(.releaseLock)
            log(.info, "refresh succeeded", ["generation": "\(generation)", "attempt": "\(cycle.attempt)",
                                              "expires_at": tokens.expiresAt.map(Timestamp.format) ?? "unknown"])
            if waitedForTheStore, let expiresAt = tokens.expiresAt, expiresAt <= now.wall {
                // The store took longer to acknowledge than the new token lives (a failover with short
                // tokens). Race it prevents: releasing the held requests with it earns each a 401 from the
                // API, and a replayed request's answer goes to its client as it is. They stay held for one
                // more refresh instead (the write landed, so its refresh token is the fleet's).
                log(.warning, "the refreshed access token expired while its write waited for the shared token store; "
                    + "refreshing again before releasing held requests")
                phase = .idle
                lastOutcome = ("success", now.wall)
                startCycle(.reactive, .expired, now)
                emit(.tokenEndpointIdle)
                return
            }
            endCycle(.renewed(generation: generation), description: "success", now)
        case .keepRotatedRefreshToken(let reason):
            tokens.refreshToken = next.refreshToken
            emit(.releaseLock)
            log(.warning, "kept the rotated refresh token from the unusable answer")
            giveUp(reason: reason, now)
        }
        emit(.tokenEndpointIdle)
    }

    // MARK: - 7. The cycle ends

    mutating func endCycle(_ outcome: Outcome, description: String, _ now: Instant) {
        emit(.cancel(.attempt))
        if case .refreshing = phase { phase = .idle }
        if case .renewed = outcome { lastRenewalAt = now.monotonic }
        lastOutcome = (description, now.wall)
        emit(.publish)
        emit(.release(outcome))
    }

    /// Ends a cycle without new tokens. A still-valid token keeps being used, and a proactive refresh is
    /// tried again later (at expiry, not before, while the refresh token is in doubt).
    mutating func giveUp(reason: String, _ now: Instant) {
        phase = .idle
        if refusedGeneration == generation { deadGeneration = generation }
        endCycle(.unavailable(reason: reason), description: "failed: \(reason)", now)
        guard let expiresAt = tokens.expiresAt, expiresAt > now.wall, settings.proactive, !stopped else { return }
        if refreshTokenInDoubt {
            scheduleProactiveRefresh(now)
        } else {
            let remaining = expiresAt.timeIntervalSince(now.wall)
            let delay = max(Self.minimumCycleSpacing, min(max(settings.backoffSeconds * 4, 1), remaining / 2))
            proactiveMode = .proactive
            emit(.schedule(.proactive, at: now.monotonic + delay))
        }
    }

    /// The credentials are dead: say why once, latch "login required". No storm: nothing refreshes until
    /// the store changes or an operator forces a refresh.
    mutating func reject(_ message: String, _ metadata: [String: String], _ now: Instant, latchInStore: Bool = true,
                                 clientRefused: Bool = false) {
        latchedOnClientRefusal = clientRefused
        emit(.count(.refreshOutcome("rejected")))
        log(.error, message, metadata)
        // Fleet-wide: stored with the token set, so the other relays stop too instead of each trying once.
        if latchInStore { emit(.latchLoginRequired(message)) }
        phase = .loginRequired
        emit(.cancel(.proactive))
        endCycle(.rejected, description: clientRefused ? "rejected: client authentication refused" : "rejected: login required", now)
    }
}
