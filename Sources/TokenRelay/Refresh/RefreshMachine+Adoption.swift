import FoundationEssentials
import Glibc

/// Tokens from the store (adoption), live settings and shutdown.
/// Part of `RefreshMachine` (RefreshMachine.swift holds its state and reads in cycle order).
extension RefreshMachine {
    // MARK: - 12. Tokens from the store

    /// The store changed under us (an operator seeding tokens after "login required", `token import`,
    /// another process's rotation) or was re-read at the end of a hold-off. Not during a cycle: the
    /// cycle re-reads it under the lock itself, and its own write must not look like someone else's.
    ///
    /// `inFlight`, the in-flight record read with it, is considered for the tokens in service afterwards
    /// (`consider`): the process that wrote them may have been killed while presenting their refresh token.
    mutating func storeRead(_ read: StoreRead, inFlight: RefreshInFlightRead? = nil, now: Instant) -> [Action] {
        let afterHoldOff = readingStoreAfterHoldOff
        readingStoreAfterHoldOff = false
        let afterOutage = readingStoreAfterOutage
        readingStoreAfterOutage = false
        if case .refreshing(let cycle) = phase {
            // A shared store announces another relay's rotation while this one waits for the lock: adopt
            // it and end the cycle without presenting anything (the driver of a file store, which cannot
            // cancel a lock wait, does not deliver reads during a cycle).
            switch (cycle.step, read) {
            case (.waiting, .tokens(let stored)) where isNewToUs(stored), (.acquiringLock, .tokens(let stored)) where isNewToUs(stored):
                adopt(stored, now)
                emit(.count(.adoptedRotation))
                log(.info, "adopted tokens another relay published", ["generation": "\(generation)"])
                emit(.releaseLock)
                endCycle(.renewed(generation: generation), description: "adopted from the token store", now)
            case (.waiting, .latched(_, let reason)), (.acquiringLock, .latched(_, let reason)):
                emit(.releaseLock)
                reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
            default: break
            }
            return drain()
        }
        if case .latched(let stored, let reason) = read {
            // Login required, fleet-wide, until new tokens are stored.
            if state != .loginRequired, !isNewToUs(stored) || stored.refreshToken != nil {
                reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
            }
            return drain()
        }
        if case .tokens(let stored) = read, isNewToUs(stored) {
            let previous = state
            adopt(stored, now)
            if let inFlight { consider(inFlight, lockHeld: false, now) }
            emit(.count(.adoptedRotation))
            log(.info, "adopted tokens written to the token file", ["generation": "\(generation)", "previous_state": previous.rawValue])
            emit(.publish)
            emit(.release(.renewed(generation: generation)))
            return drain()
        }
        if let error = Self.unreadableReason(read) {
            let place = settings.sharedStore ? "the shared token store" : "the token file"
            log(.error, afterHoldOff ? "could not re-read \(place) after the refresh hold-off"
                    : "could not read \(place); keeping the tokens in service", ["error": error])
        }
        if let inFlight { consider(inFlight, lockHeld: false, now) }
        // Nothing new after the hold-off: the proactive timer (at expiry while in doubt) takes over again.
        if afterHoldOff && holdOff == nil { scheduleProactiveRefresh(now) }
        if afterOutage, case .idle = phase {
            scheduleProactiveRefresh(now)
            // Nothing to serve with (a first start with Redis down, a token refused meanwhile): fetch now.
            if tokens.accessToken.isEmpty || isAccessTokenKnownDead { startCycle(.reactive, tokens.accessToken.isEmpty ? .noToken : .unauthorized, now) }
        }
        return drain()
    }

    /// Stored tokens (not fresh from the token endpoint): the expiry comes from the store or the JWT.
    mutating func adopt(_ stored: TokenSet, _ now: Instant) {
        let expiry = TokenExpiry.forStoredTokens(stored, now: now.wall)
        var next = stored
        next.expiresAt = expiry.expiresAt
        // Planned as adopted, not as refreshed here (`scheduleProactiveRefresh`).
        adoptedAt = now.monotonic
        obtainedHere = false
        // Tokens someone else wrote supersede ours: nothing of ours is left to save.
        if unsaved != nil {
            unsaved = nil
            emit(.cancel(.saveRetry))
        }
        adopt(next, lifetime: expiry.lifetime, now)
    }

    /// Makes `next` the tokens in service with a new generation; new tokens settle every doubt.
    mutating func adopt(_ next: TokenSet, lifetime: Double?, _ now: Instant) {
        emit(.redact([next.accessToken, next.refreshToken]))
        tokens = next
        self.lifetime = lifetime
        generation += 1
        refreshTokenInDoubt = false
        holdOff = nil
        unknownOutcomes = 0
        emit(.cancel(.holdOff))
        if case .stormPaused = phase { phase = .idle }
        if case .loginRequired = phase { phase = .idle }
        scheduleProactiveRefresh(now)
    }

    // MARK: - 13. Settings and shutdown

    /// Live reload: a cycle in flight finishes with the settings it started with; the next uses these.
    mutating func apply(_ settings: Settings, now: Instant) -> [Action] {
        self.settings = settings
        if case .idle = phase { scheduleProactiveRefresh(now) }
        return drain()
    }

    /// Graceful shutdown: no new cycle, retry or proactive refresh starts. An attempt already due and an
    /// exchange already talking to the token endpoint finish, because the answer may carry the only copy
    /// of a rotated refresh token (the drain waits for `isTalkingToTokenEndpoint`).
    mutating func shutdown(now: Instant) -> [Action] {
        stopped = true
        emit(.cancel(.proactive))
        return drain()
    }
}
