/// The upstream's answer: the head (relayed, or captured as a refresh trigger), a DPoP nonce challenge, the
/// end of the response, and a failure before any answer (retried once on a fresh connection when it may
/// be). Apart from `RequestLifecycle.swift` (phases, arrival, the connection) so each stage reads alone.
extension RequestLifecycle {
    // MARK: - The upstream's answer

    /// The response head is in. `indicatesExpiredToken`: the status and challenge say the token is no
    /// longer accepted (see `RefreshTrigger`).
    mutating func responseHead(status: Int, indicatesExpiredToken: Bool) -> ActionList {
        guard phase == .awaitingResponse else { return ActionList() }
        if indicatesExpiredToken && answerMayBeReplaced {
            phase = .capturing
            capturedStatus = status
            // The 401's body is only needed if the refresh fails; a body that drips (never silent, so never
            // cut by the silence limit) must not keep the request from being held: it gets upstream_seconds.
            return ActionList(.cancel(.connect), .schedule(.responseHead, after: settings.upstreamSeconds), .captureResponse)
        }
        phase = .relaying
        answeredStatus = status
        answeredByUpstream = true
        var actions = ActionList()
        // A streamed upload's 401 is the client's (its body has gone), but the token is dead all the same:
        // the refresh rules must hear of it, or the next requests would all be sent with it and refused
        // too, each passed on, until a replayable request happened to start the refresh.
        if attempts - nonceResends == 1 && !passthrough && indicatesExpiredToken && !bodyIsReplayable {
            actions.append(.reportUnreplayableRefreshTrigger(sentGeneration: sentGeneration))
        }
        if connectMayBeArmed {
            connectMayBeArmed = false
            actions.append(.cancel(.connect))
        }
        actions.append(.cancel(.responseHead))
        actions.append(.relayResponse)
        return actions
    }

    /// The response head is a DPoP nonce challenge (401, `WWW-Authenticate: DPoP error="use_dpop_nonce"`, and
    /// a usable `DPoP-Nonce`, which the driver has kept for this upstream). The first one is read to its end
    /// (the connection stays reusable) and the request goes again with a fresh proof; any later one, or one
    /// to a body that cannot be sent again, is the client's answer.
    mutating func nonceChallenged(status: Int) -> ActionList {
        guard phase == .awaitingResponse else { return ActionList() }
        guard nonceResends == 0, !passthrough, bodyIsReplayable else { return responseHead(status: status, indicatesExpiredToken: false) }
        phase = .capturing
        capturingNonceChallenge = true
        capturedStatus = status
        return ActionList(.cancel(.connect), .schedule(.responseHead, after: settings.upstreamSeconds), .captureResponse)
    }

    /// Back to the pool for the resend after a nonce challenge.
    /// A refresh-triggering answer now would be captured and the request sent again: this is the first send
    /// (not a replay, whose answer is the client's: the loop guard), it carries the token, and its body can
    /// still be sent whole.
    var answerMayBeReplaced: Bool {
        phase == .awaitingResponse && attempts - nonceResends == 1 && !passthrough && bodyIsReplayable
    }

    mutating func resendForNonce() -> Action {
        capturingNonceChallenge = false
        nonceResends += 1
        phase = .waitingForConnection
        return .resendWithFreshProof
    }

    /// The response is complete (its body too).
    mutating func responseEnded(now: Double) -> ActionList {
        switch phase {
        case .capturing where capturingNonceChallenge:
            return ActionList(.cancel(.responseHead), .releaseConnection, resendForNonce())
        case .capturing:
            return ActionList(.cancel(.responseHead), .releaseConnection, .consultRefreshRules(sentGeneration: sentGeneration))
        case .relaying:
            return ActionList(.releaseConnection, .endRelayedResponse, finish(now: now))
        default:
            return ActionList()
        }
    }

    /// The upstream connection failed, or the driver refused its answer (invalid, too large).
    /// `responseUnsent`: while relaying, no byte of the response has reached the client.
    mutating func upstreamFailed(_ failure: UpstreamFailure, responseUnsent: Bool = false, now: Double) -> ActionList {
        switch phase {
        case .awaitingResponse, .capturing:
            var actions = ActionList(.cancel(.connect), .cancel(.responseHead)).reporting(failure)
            if phase == .awaitingResponse && mayRetry(failure) {
                retried = true
                attempts -= 1
                phase = .waitingForConnection
                return actions + ActionList(.retrying, .acquireFreshConnection)
            }
            actions += ActionList(.releaseConnection, .upstreamFailed)
            return actions + respond(failure.isTimeout ? .gatewayTimeout : .badGateway("upstream \(failure)"), now: now)
        case .relaying:
            // `responseUnsent`: the driver took back a head that had not left yet (it waits for the first
            // body piece): the client has seen nothing, so it can still be told the truth.
            if responseUnsent {
                return ActionList(.releaseConnection, .upstreamFailed).reporting(failure) + respond(.badGateway("upstream \(failure)"), now: now)
            }
            // The head is out: a truncated response is the honest answer.
            return ActionList(.releaseConnection, .upstreamFailed, .abortClient(flushFirst: true), finish(now: now)).reporting(failure)
        default:
            return ActionList()
        }
    }

    private func mayRetry(_ failure: UpstreamFailure) -> Bool {
        guard !retried, !failure.responseStarted, bodyIsReplayable else { return false }
        switch failure.kind {
        case .connect: return true
        case .connectionLost: return sentOnReusedConnection && settings.idempotent
        case .connectTimeout, .timeout, .invalidResponse, .tooLarge, .tls: return false
        }
    }
}
