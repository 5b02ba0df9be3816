/// One client request, from arrival to answer: the proxy path and the 401 path as a pure state machine.
///
/// ```
/// start ─▶ admission ─┬─ send ─▶ waitingForConnection ─▶ awaitingResponse ─┬─ any other answer, or any answer to a replay ─▶ relaying ─▶ done
///                     │                                                     ├─ refresh-triggering answer to the first send ─▶ capturing
///                     │                                                     │       └─ (refresh rules decide)
///                     │                                                     │            replay: the token was renewed meanwhile ─▶ send again
///                     │                                                     │            hold: a refresh started or runs ─▶ held
///                     │                                                     │            passThrough: login required ─▶ the captured answer ─▶ done
///                     │                                                     └─ failure before an answer ─┬─ may retry ─▶ a fresh connection, once
///                     │                                                                                   └─ 502 / 504 ─▶ done
///                     ├─ hold (a refresh is running) ─▶ held ─┬─ renewed ─▶ send (the replay)
///                     │                                      ├─ rejected ─▶ the captured 401, or tokenrelay's 401 ─▶ done
///                     │                                      └─ unavailable / hold deadline ─▶ 503 ─▶ done
///                     ├─ login required ─▶ 401 ─▶ done
///                     └─ refresh on hold-off ─▶ 503 ─▶ done
/// client gone at any point ─▶ done (the driver cancels whatever is under way)
/// a DPoP nonce challenge (401 use_dpop_nonce) to a send ─▶ capturing ─▶ resent once with a fresh proof
/// ```
///
/// Rules that keep clients and the session safe:
/// - A request is replayed at most once after a refresh-triggering answer, so an upstream that keeps
///   refusing a fresh token can never make a loop.
/// - The token is read when the connection is in hand, not at arrival: a refresh may have finished while
///   the request waited in the pool's queue, and sending the old token would cost a needless 401.
/// - A failure before any response byte is retried on a fresh connection at most once, and only when the
///   upstream cannot have acted on it (never connected) or acting twice is harmless (an idempotent method
///   on a reused connection: the keep-alive race where the upstream closes just as we send).
/// - Once a response has started reaching the client it cannot be replaced: an upstream failure then cuts
///   the client's connection (a truncated response, never a clean end).
/// - A streamed request body (one too large to keep) can be sent only once: from its first byte on the
///   upstream (`streamedBodyProgressed`), a refresh-triggering answer is the client's and a failure is
///   not retried. Before that byte (the driver sends such a request with `Expect: 100-continue`, so a 401
///   comes first) it is replayed like any other.
/// - A DPoP nonce challenge (the upstream wants a proof with its fresh nonce) is resent at most once per
///   request, with no refresh: a server that keeps asking for a new nonce can never make a loop, and a
///   second challenge is the client's answer. The resend does not use up the refresh rules' one chance
///   (a token that expired meanwhile is still refreshed once).
///
/// Pure: no I/O, no clock of its own (`now` comes with each event), no transport import. The driver
/// (`DataPlane/RelayedExchange`, on HTTPTransport) feeds it events and carries out its actions
/// in order.
struct RequestLifecycle {
    enum Phase: Equatable {
        case arrived
        case waitingForConnection
        case awaitingResponse
        case capturing
        case held
        case relaying
        case finished
    }

    typealias Admission = RefreshCoordinator.Admission
    typealias RefreshRulesDecision = RefreshMachine.UnauthorizedDecision
    typealias RefreshOutcome = RefreshMachine.Outcome

    let settings: Settings
    private(set) var phase = Phase.arrived
    /// Forwarded untouched: no token injected, no refresh on its 401 (`passthrough_paths`).
    private(set) var passthrough = false
    /// Sends that reached the point of waiting for an answer (a retried failure does not count): the
    /// refresh rules apply to the first one only.
    private(set) var attempts = 0
    private(set) var sentGeneration: UInt64 = 0
    private var retried = false
    /// Resends after a DPoP nonce challenge (0 or 1: the loop guard). Not counted as a send for the
    /// refresh rules' "first answer" test.
    private(set) var nonceResends = 0
    /// The answer being captured is a nonce challenge: its end resends instead of asking the refresh rules.
    private var capturingNonceChallenge = false
    private var sentOnReusedConnection = false
    private var heldSince: Double?
    private var holdDeadline: Double?
    /// The current hold is the request's first: if the list of held requests refuses it, the request
    /// was never held at all (no hold duration is recorded for it).
    private var holdIsFirst = false
    private var capturedStatus: Int?
    private var answeredStatus = 0
    private var answeredByUpstream = false
    /// The client left before anything was answered: the summary then reports `clientClosedRequest`.
    private var clientLeftUnanswered = false
    /// A body that is streamed (not kept) can be sent only once: after its first byte has gone, a
    /// refresh-triggering answer is passed to the client as it is.
    private(set) var bodyIsReplayable = true
    /// The answer captured is a gRPC status (`grpcStatusBeforeMessage`), not an HTTP 401: a rejected
    /// refresh that gives it back to the client is still an "unauthorized" end of a hold.
    var capturedGRPCRefusal = false
    /// Whether a pool-wait or connect deadline may be armed: set when the machine schedules it, cleared
    /// where the ordinary path cancels it. The ordinary request (an idle connection at once, or a reused
    /// one) thus asks for no cancel of a deadline it never set or cancelled already: these steps run for
    /// every request, and each action costs the driver a move, a dispatch and a destroy. A flag left set
    /// by a rarer path costs only a cancel that finds nothing armed; it is never clear while the deadline
    /// is armed.
    private var poolWaitMayBeArmed = false
    private var connectMayBeArmed = false
    /// What `finish` reports, set when the machine finishes (and never again: a finished machine takes
    /// no more events), so the driver reads it whenever the `finish` action runs.
    private(set) var summary: Summary?

    init(settings: Settings) {
        self.settings = settings
    }

    var isFinished: Bool { phase == .finished }

    // MARK: - Arrival

    /// `admission`: the refresh rules' answer for a request arriving now (nil for passthrough requests).
    mutating func start(admission: Admission?, now: Double) -> ActionList {
        guard phase == .arrived else { return ActionList() }
        if case nil = admission { passthrough = true }
        return admit(admission, now: now)
    }

    /// A request refused before anything was forwarded (smuggling probes, foreign hosts, TRACE).
    mutating func refuse(_ response: LocalResponse, now: Double) -> ActionList {
        guard phase == .arrived else { return ActionList() }
        return respond(response, now: now)
    }

    private mutating func admit(_ admission: Admission?, now: Double) -> ActionList {
        switch admission {
        case nil, .send:
            phase = .waitingForConnection
            return ActionList(.acquireConnection(admittedEarlier: heldSince != nil))
        case .hold:
            return hold(now: now)
        case .loginRequired:
            return respond(.loginRequired, now: now)
        case .unavailable(let retryAfter):
            return respond(.refreshOnHold(retryAfter: retryAfter), now: now)
        }
    }

    // MARK: - Waiting for a connection

    /// The pool has no free connection; the request waits in its queue, but only so long: a stalled
    /// upstream must turn into quick 503s, not an unbounded queue of clients.
    mutating func connectionQueued() -> ActionList {
        guard phase == .waitingForConnection else { return ActionList() }
        poolWaitMayBeArmed = true
        return ActionList(.schedule(.poolWait, after: settings.poolWaitSeconds))
    }

    /// The pool's queue is full.
    mutating func connectionRefused(now: Double) -> ActionList {
        guard phase == .waitingForConnection else { return ActionList() }
        return respond(.poolExhausted("too many requests are waiting for an upstream connection"), now: now)
    }

    /// A connection is in hand. `admission`: the refresh rules' answer *now* (nil for passthrough): a
    /// refresh may have started or finished while the request waited.
    mutating func connectionAcquired(reused: Bool, admission: Admission?, now: Double) -> ActionList {
        guard phase == .waitingForConnection else { return ActionList(.releaseConnection) }
        let credential: Credential
        switch admission {
        case nil: credential = .none
        case .send(let generation, _): credential = .token(generation: generation)
        case let other?:
            return ActionList(.cancel(.poolWait), .releaseConnection) + admit(other, now: now)
        }
        attempts += 1
        sentOnReusedConnection = reused
        if case .token(let generation) = credential { sentGeneration = generation }
        capturedStatus = nil
        capturedGRPCRefusal = false
        phase = .awaitingResponse
        // Written out whole: this runs for every request, and growing an array is an allocation each time.
        let send = Action.send(credential), headDeadline = Action.schedule(.responseHead, after: settings.upstreamSeconds)
        let cancelPoolWait = poolWaitMayBeArmed
        poolWaitMayBeArmed = false
        if reused {
            return cancelPoolWait ? ActionList(.cancel(.poolWait), send, headDeadline) : ActionList(send, headDeadline)
        }
        connectMayBeArmed = true
        let connectDeadline = Action.schedule(.connect, after: settings.connectSeconds)
        return cancelPoolWait ? ActionList(.cancel(.poolWait), send, headDeadline, connectDeadline) : ActionList(send, headDeadline, connectDeadline)
    }

    /// The transport reports the connection established (TCP, and TLS if any).
    mutating func connected() -> ActionList {
        connectMayBeArmed = false
        return ActionList(.cancel(.connect))
    }

    /// The first byte of a streamed request body has left for the upstream.
    mutating func streamedBodyStarted() {
        bodyIsReplayable = false
    }

    /// A piece of a streamed request body (one too large to keep for a replay) has gone to the upstream.
    /// From the first piece on the body cannot be sent again (no capture of a 401, no retry). The
    /// response-head deadline then runs from the last piece: an upload lasts as long as the client and the
    /// upstream need (a 20 MiB body must not be cut by the deadline meant for the answer), while an
    /// upstream that stops taking the body, or never answers after it, still times out.
    mutating func streamedBodyProgressed() -> ActionList {
        bodyIsReplayable = false
        guard phase == .awaitingResponse else { return ActionList() }
        return ActionList(.schedule(.responseHead, after: settings.upstreamSeconds))
    }

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

    private mutating func resendForNonce() -> Action {
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
    private mutating func hold(now: Double) -> ActionList {
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

    // MARK: - The client, and shutdown

    /// The status reported (access log, request metric) for a request whose client left before it was
    /// answered: nginx's 499, so that one count means the same in both (no such status is ever sent).
    static let clientClosedRequest = 499

    /// The client hung up (or its connection failed): nobody is left to answer.
    mutating func clientGone(now: Double) -> ActionList {
        guard phase != .finished else { return ActionList() }
        let wasHeld = phase == .held
        if answeredStatus == 0 {
            clientLeftUnanswered = true
            answeredStatus = Self.clientClosedRequest
        }
        return ActionList(.cancelUpstream) + (wasHeld ? ActionList(.unhold) : ActionList()) + ActionList(finish(now: now))
    }

    /// The drain deadline passed at shutdown.
    mutating func abandon(now: Double) -> ActionList {
        switch phase {
        case .finished: return ActionList()
        case .relaying: return ActionList(.cancelUpstream, .abortClient(flushFirst: false), finish(now: now))
        case .held: return ActionList(.unhold, .cancel(.hold)) + respond(.unavailable("tokenrelay is shutting down"), now: now)
        default: return ActionList(.cancelUpstream) + respond(.unavailable("tokenrelay is shutting down"), now: now)
        }
    }

    // MARK: - Answers

    private mutating func respond(_ response: LocalResponse, now: Double) -> ActionList {
        answeredStatus = Int(response.status)
        answeredByUpstream = false
        return ActionList(.respond, finish(now: now)).answering(response)
    }

    private mutating func respondCaptured(now: Double) -> ActionList {
        answeredStatus = capturedStatus ?? 401
        answeredByUpstream = false
        return ActionList(.respondCaptured, finish(now: now))
    }

    private mutating func finish(now: Double) -> Action {
        phase = .finished
        var summary = Summary(status: answeredStatus, attempts: attempts, generation: sentGeneration)
        if let since = heldSince {
            let outcome: HoldOutcome = switch answeredStatus {
            case _ where clientLeftUnanswered: .clientGone
            case _ where answeredByUpstream: .replayed
            case 503: .unavailable
            case 401: .unauthorized
            case _ where capturedGRPCRefusal: .unauthorized
            default: .other
            }
            summary.hold = (max(0, now - since), outcome)
        }
        self.summary = summary
        return .finish
    }
}
