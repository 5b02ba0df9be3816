import FoundationEssentials
import Glibc

/// A cycle: it starts, takes the lock, re-reads the store, presents the refresh token, and reads the token endpoint's answer.
/// Part of `RefreshMachine` (RefreshMachine.swift holds its state and reads in cycle order).
extension RefreshMachine {
    // MARK: - 3. A cycle starts

    mutating func startCycle(_ mode: Mode, _ trigger: Trigger, _ now: Instant) {
        guard !stopped, holdOff == nil, storeOutage == nil else { return }
        if case .refreshing(var cycle) = phase {
            if mode == .reactive && cycle.mode != .reactive {
                cycle.mode = .reactive
                phase = .refreshing(cycle)
            }
            return
        }
        phase = .refreshing(Cycle(mode: mode, trigger: trigger, settings: settings, step: .waiting))
        lastCycleStartedAt = now.monotonic
        emit(.cancel(.proactive))
        emit(.count(.cycleStarted(trigger)))
        log(.info, "refresh started", ["trigger": trigger.rawValue, "mode": mode.rawValue, "generation": "\(generation)"])
        emit(.publish)
        // The first attempt runs from a timer, never inside this call: the request whose 401 started the
        // cycle must have joined the held list before a cycle that ends at once (tokens adopted from the
        // store, no refresh token) releases it. A `Retry-After` from the last cycle still holds: a
        // server that asked for a pause gets it, however many 401s arrive meanwhile.
        emit(.schedule(.attempt, at: max(now.monotonic, notBefore)))
    }

    // MARK: - 4. Take the lock, re-read the store, present the refresh token

    mutating func attemptTimerFired(_ now: Instant) {
        guard case .refreshing(var cycle) = phase, case .waiting = cycle.step else { return }
        cycle.step = .acquiringLock
        phase = .refreshing(cycle)
        emit(.acquireLock(timeout: cycle.settings.lockTimeout))
    }

    /// Another process holding the lock past the timeout: counts as an attempt, or it would keep this
    /// cycle alive forever.
    mutating func lockTimedOut(now: Instant) -> [Action] {
        guard case .refreshing(var cycle) = phase, case .acquiringLock = cycle.step else { return drain() }
        cycle.attempt += 1
        phase = .refreshing(cycle)
        let lock = cycle.settings.sharedStore
            ? "the fleet's refresh lock (held by another relay, or the token store did not answer)" : "the token file lock"
        transientFailure("timed out waiting for \(lock)", outcomeUnknown: false, retryAfter: 0, lockHeld: false, now)
        return drain()
    }

    /// Under the lock, the store as it is now. Race it prevents: another process rotated the tokens
    /// while we waited; presenting our (burnt) refresh token would be reuse. Its tokens are adopted instead.
    ///
    /// `inFlight` is the in-flight record as it is now. Race it prevents: another process sharing the
    /// token file presented this very refresh token and was killed before the answer; its lock is gone
    /// with it, but the server may still be working on that presentation (`consider`).
    mutating func lockAcquired(store: StoreRead?, lockValidUntil: Double? = nil, inFlight: RefreshInFlightRead? = nil, now: Instant) -> [Action] {
        guard case .refreshing(var cycle) = phase, case .acquiringLock = cycle.step else {
            emit(.releaseLock)
            return drain()
        }
        if case .latched(_, let reason)? = store {
            // Another relay was refused by the token server: the refresh token is dead fleet-wide.
            emit(.releaseLock)
            reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
            return drain()
        }
        if case .tokens(let stored)? = store, isNewToUs(stored) {
            adopt(stored, now)
            if let inFlight { consider(inFlight, lockHeld: true, now) }
            emit(.count(.adoptedRotation))
            log(.info, "adopted tokens rotated by another process", ["generation": "\(generation)"])
            emit(.releaseLock)
            endCycle(.renewed(generation: generation), description: "adopted from token file", now)
            return drain()
        }
        if let inFlight { consider(inFlight, lockHeld: true, now) }
        if let holdOff {
            emit(.releaseLock)
            giveUp(reason: holdOff.reason, now)
            return drain()
        }
        if cycle.settings.needsRefreshToken && tokens.refreshToken == nil {
            emit(.releaseLock)
            // Not latched in a shared store: a relay that holds nothing says nothing about the fleet's tokens.
            reject("refresh impossible: the token file has no refresh_token; login required", [:], now, latchInStore: false)
            return drain()
        }
        if cycle.settings.sharedStore, case .unreadable(let error)? = store {
            // The fleet may have rotated: presenting our refresh token unseen could be reuse.
            transientFailure("cannot read the token store under the lock: \(error)", outcomeUnknown: false, retryAfter: 0, lockHeld: true, now)
            return drain()
        }
        if case .sealedUnopened(let error)? = store {
            // Race it prevents: another process (a relay restarted with a rotated key, `token import`) sealed a
            // newer rotation we cannot open; presenting our refresh token could be reuse, and our write would
            // replace its tokens with ours.
            transientFailure("cannot open the token file under the lock: \(error)", outcomeUnknown: false, retryAfter: 0, lockHeld: true, now)
            return drain()
        }
        // A lock that expires while the refresh is at the token server lets a second relay present the
        // same refresh token: never send unless the lock outlives the exchange and the write after it.
        // The exchange starts now, bounded by the token endpoint settings in force now: a reload since
        // this cycle began (a longer refresh_seconds) lengthens it, while a lock taken before that reload
        // keeps its own, shorter life. So the longer of the cycle's and the running bounds must fit.
        let exchangeBound = max(cycle.settings.refreshTimeout, settings.refreshTimeout)
            + max(cycle.settings.storeWriteTimeout, settings.storeWriteTimeout)
        if let lockValidUntil, lockValidUntil - now.monotonic < exchangeBound {
            transientFailure("the refresh lock has too little life left to cover a refresh", outcomeUnknown: false, retryAfter: 0,
                             lockHeld: true, now)
            return drain()
        }
        cycle.attempt += 1
        // A shared store keeps its record beside the lock (the lock expires; the record stays until the
        // answer is stored), so a relay that died with an answer it could not write holds the fleet off.
        guard cycle.settings.needsRefreshToken, let refreshToken = tokens.refreshToken else {
            phase = .refreshing(cycle)
            present(now)
            return drain()
        }
        // Durably first (rule in `recordInFlight`), then the refresh token leaves.
        cycle.step = .recordingInFlight(RefreshInFlightRecord(refreshToken: refreshToken, sentAt: now.wall))
        phase = .refreshing(cycle)
        emit(.recordInFlight(RefreshInFlightRecord(refreshToken: refreshToken, sentAt: now.wall)))
        return drain()
    }

    /// Rule (the race it prevents: this process is killed while the server works on its presentation,
    /// and the next start presents the same refresh token again; a rotation server then sees a burnt
    /// token and revokes the whole session): no refresh token leaves before a record of it is on disk
    /// (`RefreshInFlightMarker`). The record stays until the answer is handled and saved, or, after an
    /// unknown outcome, until the refresh token it names is no longer the one in service.
    mutating func inFlightRecorded(now: Instant) -> [Action] {
        guard case .refreshing(let cycle) = phase, case .recordingInFlight(let record) = cycle.step else { return drain() }
        recordOnDisk = record
        present(now)
        return drain()
    }

    /// Nothing left: a transient failure (retried with backoff), never a presentation without a record.
    mutating func inFlightRecordFailed(_ error: String, now: Instant) -> [Action] {
        guard case .refreshing(let cycle) = phase, case .recordingInFlight = cycle.step else { return drain() }
        log(.error, "could not record the refresh in flight; the refresh token was not sent", ["error": error])
        transientFailure("could not record the refresh in flight (\(error))", outcomeUnknown: false, retryAfter: 0, lockHeld: true, now)
        return drain()
    }

    /// Present the refresh token: once per attempt, and never by anyone but this cycle.
    mutating func present(_ now: Instant) {
        guard case .refreshing(var cycle) = phase else { return }
        let record: RefreshInFlightRecord?
        if case .recordingInFlight(let recorded) = cycle.step { record = recorded } else { record = nil }
        if cycle.attempt == 1 && cycle.trigger == .unauthorized { reactiveRefreshTimes.append(now.monotonic) }
        cycle.step = .exchanging(sentAt: now.monotonic, record: record)
        phase = .refreshing(cycle)
        refreshCount += 1
        if cycle.settings.needsRefreshToken, let refreshToken = tokens.refreshToken {
            spentRefreshTokens = Array((spentRefreshTokens + [refreshToken]).suffix(16))
        }
        emit(.presentRefreshToken(tokens))
    }

    func isNewToUs(_ candidate: TokenSet) -> Bool {
        let changed = candidate.accessToken != tokens.accessToken || candidate.refreshToken != tokens.refreshToken
        let spent = candidate.refreshToken.map { spentRefreshTokens.contains($0) } ?? false
        return changed && !spent
    }

    // MARK: - 5. The token endpoint answers

    mutating func tokenEndpointAnswered(_ result: TokenEndpointResult, retryAfter: Double?, now: Instant) -> [Action] {
        guard case .refreshing(let cycle) = phase, case .exchanging(let sentAt, _) = cycle.step else { return drain() }
        emit(.count(.refreshDuration(max(0, now.monotonic - sentAt))))
        if let retryAfter { notBefore = now.monotonic + retryAfter }
        switch result {
        case .granted(let grant):
            emit(.count(.refreshOutcome("success")))
            let (next, lifetime) = tokens.renewed(by: grant, now: now.wall)
            emit(.redact([next.accessToken, next.refreshToken]))
            for warning in grant.warnings { log(.warning, "token endpoint answer: \(warning)") }
            persist(next, lifetime: lifetime, purpose: .renewal, cycle)
        case .rejected(let status, let oauthError):
            emit(.count(.refreshError(code: oauthError ?? "http_\(status)")))
            removeInFlightRecord()
            emit(.releaseLock)
            if let oauthError, Self.clientRefusalErrors.contains(oauthError) {
                // The client's credential was refused, not the refresh token: the session is fine. Nothing is
                // latched in the shared store (another relay's credential may be the good one), and a change
                // of the secret or key asks again (Relay+Credentials).
                reject(oauthError == Self.dpopProofRefusal
                       ? "the token endpoint refused the DPoP proof (check the clock and dpop.alg); keeping the refresh token until POST /refresh or a credential change"
                       : "client authentication refused; keeping the refresh token until the client credential changes",
                       ["status": "\(status)", "error": oauthError], now, latchInStore: false, clientRefused: true)
            } else {
                reject("refresh rejected; login required", ["status": "\(status)", "error": oauthError ?? "none"], now)
            }
        case .transient(let reason, let outcomeUnknown):
            transientFailure(reason, outcomeUnknown: outcomeUnknown, retryAfter: retryAfter ?? 0, lockHeld: true, now)
        case .unusable(let reason):
            // Nothing was sent.
            removeInFlightRecord()
            emit(.releaseLock)
            reject("refresh impossible; login required", ["reason": reason], now)
        case .invalidResponse(let reason, let rotation):
            emit(.count(.refreshOutcome("invalid_response")))
            log(.error, "refresh failed: invalid token endpoint response", ["reason": reason])
            switch rotation {
            case .rotated(let refreshToken) where cycle.settings.needsRefreshToken:
                // Race it prevents: the old refresh token is burnt by this answer; dropping the new one
                // would leave us presenting a burnt token next time.
                var kept = tokens
                kept.refreshToken = refreshToken
                emit(.redact([kept.accessToken, refreshToken]))
                persist(kept, lifetime: lifetime, purpose: .keepRotatedRefreshToken(reason: reason), cycle)
            case .unknown where cycle.settings.needsRefreshToken:
                refreshTokenInDoubt = true
                startHoldOff(sentAt: sentAt, reason: reason, now)
                emit(.releaseLock)
                giveUp(reason: reason, now)
            default:
                // Nothing rotated, and the server is done with it: it answered.
                removeInFlightRecord()
                emit(.releaseLock)
                giveUp(reason: reason, now)
            }
        }
        emit(.tokenEndpointIdle)
        return drain()
    }

    mutating func transientFailure(_ reason: String, outcomeUnknown: Bool, retryAfter: Double, lockHeld: Bool, _ now: Instant) {
        guard case .refreshing(var cycle) = phase else { return }
        // A definite failure (a 5xx or 429 answer, a refused connection, a record that could not be
        // written): nothing is in progress at the server. An unknown outcome keeps its record.
        if !outcomeUnknown && lockHeld { removeInFlightRecord() }
        if lockHeld { emit(.releaseLock) }
        emit(.count(.refreshOutcome("transient_failure")))
        var metadata = ["reason": reason, "attempt": "\(cycle.attempt)"]
        if outcomeUnknown { metadata["outcome"] = "unknown" }
        if outcomeUnknown && cycle.settings.needsRefreshToken, case .exchanging(let sentAt, _) = cycle.step {
            // Unknown outcome: the server may have rotated the refresh token and may still be working on
            // it. End the cycle and hold off (`startHoldOff`).
            refreshTokenInDoubt = true
            startHoldOff(sentAt: sentAt, reason: reason, now)
            metadata["hold_off_seconds"] = cFormat("%.2f", (holdOff?.until ?? now.monotonic) - now.monotonic)
            log(.error, "refresh outcome unknown; not retrying now (the refresh token may already be rotated)", metadata)
            return giveUp(reason: "refresh outcome unknown (\(reason)); the refresh token is not presented again for now", now)
        }
        guard cycle.attempt < cycle.settings.maxAttempts, !stopped else {
            log(.error, "refresh failed; giving up for now", metadata)
            return giveUp(reason: reason, now)
        }
        // Backoff, doubled per attempt with ±20 % jitter; a server's Retry-After wins over a shorter one
        // (no retry storm against a token endpoint that said how long it needs).
        let exponent = Double(min(max(0, cycle.attempt - 1), 20))
        let backoff = cycle.settings.backoffSeconds * pow(2, exponent) * (0.8 + 0.4 * now.jitter)
        let delay = max(backoff, retryAfter)
        metadata["retry_in"] = cFormat("%.2fs", delay)
        log(.warning, outcomeUnknown ? "refresh outcome unknown; retrying" : "refresh failed; retrying", metadata)
        cycle.step = .waiting
        phase = .refreshing(cycle)
        emit(.schedule(.attempt, at: now.monotonic + delay))
    }
}
