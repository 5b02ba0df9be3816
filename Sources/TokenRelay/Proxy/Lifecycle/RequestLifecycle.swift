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
    // State the stages in RequestLifecycle+UpstreamAnswer/+RefreshPath/+Ending.swift read and set is internal,
    // not private (a `private` member is visible only in this file); only the machine's own methods set it.
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
    var phase = Phase.arrived
    /// Forwarded untouched: no token injected, no refresh on its 401 (`passthrough_paths`).
    private(set) var passthrough = false
    /// Sends that reached the point of waiting for an answer (a retried failure does not count): the
    /// refresh rules apply to the first one only.
    var attempts = 0
    private(set) var sentGeneration: UInt64 = 0
    var retried = false
    /// Resends after a DPoP nonce challenge (0 or 1: the loop guard). Not counted as a send for the
    /// refresh rules' "first answer" test.
    var nonceResends = 0
    /// The answer being captured is a nonce challenge: its end resends instead of asking the refresh rules.
    var capturingNonceChallenge = false
    var sentOnReusedConnection = false
    var heldSince: Double?
    var holdDeadline: Double?
    /// The current hold is the request's first: if the list of held requests refuses it, the request
    /// was never held at all (no hold duration is recorded for it).
    var holdIsFirst = false
    var capturedStatus: Int?
    var answeredStatus = 0
    var answeredByUpstream = false
    /// The client left before anything was answered: the summary then reports `clientClosedRequest`.
    var clientLeftUnanswered = false
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
    var connectMayBeArmed = false
    /// What `finish` reports, set when the machine finishes (and never again: a finished machine takes
    /// no more events), so the driver reads it whenever the `finish` action runs.
    var summary: Summary?

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

}
