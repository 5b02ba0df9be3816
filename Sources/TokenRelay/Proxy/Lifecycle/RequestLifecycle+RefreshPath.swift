/// The refresh path and the deadlines: what the refresh rules decided for a captured answer (replay, hold,
/// pass through), the hold and its end, and every timer's expiry. Apart from `RequestLifecycle.swift` so
/// the 401 path reads in one place.
extension RequestLifecycle {
    // MARK: - The refresh path

    /// The refresh rules' answer to `consultRefreshRules`.
    mutating func refreshRulesDecided(_ decision: RefreshRulesDecision, now: Double) -> ActionList {
        guard phase == .capturing else { return ActionList() }
        switch decision {
        case .replay:
            phase = .waitingForConnection
            return ActionList(.countReplay(.staleGeneration), .acquireConnection(admittedEarlier: heldSince != nil))
        case .hold:
            return hold(now: now)
        case .passThrough:
            return respondCaptured(now: now)
        case .unavailable(let retryAfter):
            return respond(.refreshOnHold(retryAfter: retryAfter), now: now)
        case .noRefresh:
            return respond(.noRefresh, now: now)
        }
    }

    /// The hold deadline runs from the first hold: a request held, replayed, and held again does not
    /// get a second full wait.
    mutating func hold(now: Double) -> ActionList {
        phase = .held
        holdIsFirst = heldSince == nil
        if holdIsFirst { heldSince = now }
        let deadline = holdDeadline ?? now + settings.holdSeconds
        holdDeadline = deadline
        return ActionList(.hold, .schedule(.hold, after: max(0, deadline - now)))
    }

    /// The list of held requests is full (`limits.max_held_requests`).
    mutating func holdRefused(now: Double) -> ActionList {
        guard phase == .held else { return ActionList() }
        if holdIsFirst { heldSince = nil }
        return ActionList(.cancel(.hold)) + respond(.tooManyHeld, now: now)
    }

    /// A refresh cycle ended. After `renewed` the replay reads the token when its connection is in hand.
    mutating func refreshFinished(_ outcome: RefreshOutcome, now: Double) -> ActionList {
        guard phase == .held else { return ActionList() }
        let leave = ActionList(.cancel(.hold), .unhold)
        switch outcome {
        case .renewed:
            phase = .waitingForConnection
            let replay = attempts > 0 ? ActionList(.countReplay(.afterRefresh)) : ActionList()
            return leave + replay + ActionList(.acquireConnection(admittedEarlier: true))
        case .rejected:
            return leave + (capturedStatus != nil ? respondCaptured(now: now) : respond(.loginRequired, now: now))
        case .unavailable:
            return leave + respond(.unavailable("no valid access token could be obtained; try again later"), now: now)
        }
    }

    // MARK: - Deadlines

    mutating func timerFired(_ timer: Timer, now: Double) -> ActionList {
        switch (timer, phase) {
        case (.poolWait, .waitingForConnection):
            return ActionList(.cancelConnectionWait) + respond(.poolExhausted("timed out waiting for a free upstream connection"), now: now)
        case (.connect, .awaitingResponse):
            // The cancel also stops the connect attempt.
            let failure = UpstreamFailure(kind: .connectTimeout, responseStarted: false, description: "could not connect in time")
            return ActionList(.cancel(.responseHead), .cancelUpstream, .releaseConnection, .upstreamFailed).reporting(failure)
                + respond(.gatewayTimeout, now: now)
        case (.responseHead, .awaitingResponse):
            // The connection is closed by the cancel: never reused with half a head in it.
            let failure = UpstreamFailure(kind: .timeout, responseStarted: false, description: "timed out")
            return ActionList(.cancel(.connect), .cancelUpstream, .releaseConnection, .upstreamFailed).reporting(failure)
                + respond(.gatewayTimeout, now: now)
        case (.responseHead, .capturing) where capturingNonceChallenge:
            // The challenge's body did not end in time: its connection is closed, the resend takes another.
            return ActionList(.cancelUpstream, resendForNonce())
        case (.responseHead, .capturing):
            // The 401's body did not end in time: decide with what was read (the connection, with the rest
            // of that body in it, is closed, never reused).
            return ActionList(.cancelUpstream, .consultRefreshRules(sentGeneration: sentGeneration))
        case (.hold, .held):
            return ActionList(.unhold) + respond(.unavailable("timed out waiting for a token refresh"), now: now)
        default:
            return ActionList()
        }
    }
}
