import HTTPTransport
import HTTPWire

/// One client request on the transport front end: carries out `RequestLifecycle`'s decisions with
/// HTTPTransport's connections. The rules are the machine's; this class turns connection callbacks into
/// its events and its actions into transport calls, and keeps the request (head, and a body up to
/// `limits.max_body_bytes`) for a replay. A larger body is streamed (`StreamedRequestBody`).
///
/// Lifetime: retained by itself from `begin()` until the machine's `finish`, which runs exactly once and
/// lets go of every timer, queue place and connection.
///
/// Carrying out the machine's actions lives in RelayedExchange+Actions.swift, the upstream connection in
/// +Upstream and its reports in +UpstreamCallbacks, the answers and the end in +Answers, the HTTP/2 upstream
/// side in +HTTP2Upstream; the state they share is internal for that (Swift's `private` stops at the file),
/// and only the exchange's own files change it.
final class RelayedExchange<Session: ExchangeSession>: ProxiedExchange, HTTPClientConnectionHandler, DeadlineTimerOwner {
    /// Strong: the session may end (its client closed after this response) before this exchange's last
    /// action runs; `finish` tells it, and the reference cycle ends there.
    let session: Session
    let client: Session.Client
    /// The settings as of arrival, the services to report to, and the proxy. Its route (upstream and pool)
    /// and token header serve this request from arrival to answer, whatever a reload changes meanwhile.
    let context: ExchangeContext
    var route: UpstreamRoute { context.route }
    var proxy: ProxyServer { context.proxy }
    let head: ReceivedRequestHead
    /// Bytes of the target its route strips (`routes[].match.strip_prefix`); 0 for most.
    private let strip: Int
    let body: Body
    /// The target as sent upstream, in a buffer borrowed from the session and given back at `finish`.
    var upstreamTarget: [UInt8] = []
    /// A path passed through untouched (no token; the client's own credentials cross).
    var passthrough = false
    /// The protocol a WebSocket-style handshake asks for (see `UpgradeTunnel`); nil for other requests.
    let upgradeProtocol: String?
    /// A slot of `limits.max_tunnels` taken for this handshake; it passes to the tunnel at the 101.
    var holdsTunnelSlot = false

    var lifecycle: RequestLifecycle
    var queue = LifecycleActionQueue()
    var finished: Bool { queue.isFinished }

    /// The refresh rules' answer at arrival, while `begin` runs: a connection granted within that same call
    /// (an idle one) is sent with it instead of asking again. Nothing else runs on the loop in between, so
    /// asking again could only repeat the answer.
    var admissionAtArrival: RefreshCoordinator.Admission?
    /// The token of the admission reported with the latest `connectionAcquired`, for the `send` it yields
    /// (the action names the token's generation only: actions carry no strings, see `RequestLifecycle.Action`).
    /// Kept until the next grant: the send may run after the step that decided it (behind a running batch).
    var grantedAuthorization: String?

    let arrivedAt = EventLoop.monotonicNow
    var sentAt = 0.0
    var upstream: HTTPClientConnection?
    /// The request's stream when the route's upstream speaks HTTP/2 (nil on the HTTP/1.1 path), and what
    /// its response brought (see `RelayedExchange+HTTP2Upstream`).
    var http2: HTTP2UpstreamLink?
    var ticket: HTTPTransport.UpstreamPool.Ticket?
    /// One timer per deadline, borrowed from the session when first scheduled (stored apart, not in a
    /// dictionary: that would be an allocation per request).
    var poolWaitTimer, connectTimer, responseHeadTimer, holdTimer: DeadlineTimer?
    /// An upstream 401 kept while its request waits for a refresh: if the refresh is rejected, the client
    /// gets exactly this response (status, headers, up to `maxCapturedBodyBytes` of body), as if tokenrelay
    /// were not there.
    var captured: CapturedResponse?
    static var maxCapturedBodyBytes: Int { capturedBodyLimit }
    var upstreamReadingPaused = false
    var selfRetain: Unmanaged<RelayedExchange>?
    var activeSlot = -1

    /// A request body: kept whole (up to `limits.max_body_bytes`, so it can be sent again), or streamed.
    enum Body {
        case kept([UInt8])
        case streamed(StreamedRequestBody)
    }

    /// `strip`: bytes of the target the request's route drops before it goes upstream (`strip_prefix`).
    init(context: ExchangeContext, strip: Int = 0, session: Session, head: ReceivedRequestHead, body: Body) {
        self.context = context
        self.strip = strip
        self.session = session
        client = session.client
        upgradeProtocol = session.client.http1Connection.flatMap { UpgradeTunnel.requestedProtocol(head, on: $0) }
        let timeouts = context.timeouts
        lifecycle = RequestLifecycle(settings: .init(
            idempotent: head.method.isIdempotent, holdSeconds: timeouts.holdSeconds, poolWaitSeconds: timeouts.poolWaitSeconds,
            upstreamSeconds: timeouts.upstreamSeconds, connectSeconds: timeouts.connectSeconds, streamIdleSeconds: timeouts.streamIdleSeconds))
        // Stored last, after every read of the argument: moved in, not copied.
        self.head = head
        self.body = body
        streamed?.onProgress = { [weak self] in
            guard let self, !self.finished else { return }
            self.step { $0.streamedBodyProgressed() }
        }
    }

    var streamed: StreamedRequestBody? {
        if case .streamed(let body) = body { return body }
        return nil
    }

    // MARK: - Arrival

    func begin() {
        selfRetain = Unmanaged.passRetained(self)
        proxy.began(self)
        let route = self.route
        route.requestBegan()
        let now = EventLoop.monotonicNow
        switch head.method {
        case .connect: return refuse(.connectRefused, log: "CONNECT")
        // RFC 9110 §9.3.8: no credentials in a TRACE; an upstream that echoes it would hand out the token.
        case .trace: return refuse(.traceRefused, log: "TRACE")
        default: break
        }
        if context.answersNotFound {
            // No route matches and there is no top-level upstream: nothing goes anywhere, the connection stays.
            proxy.noRouteMatched(head)
            return step { $0.refuse(.noRoute, now: now) }
        }
        if upgradeProtocol != nil {
            guard proxy.takeTunnelSlot() else { return refuse(.tooManyTunnels, log: "upgrade over limits.max_tunnels") }
            holdsTunnelSlot = true
        }
        // Cutting the prefix drops an absolute-form target's authority: judged first, as on any other route
        // (another host, scheme or userinfo is a 400, not a request to this route's upstream with its token).
        if strip > 0, head.target.first != UInt8(ascii: "/"),
           let refusal = route.targets.refusal(ofAbsolute: String(decoding: head.target, as: UTF8.self)) {
            return refuse(.badRequest(refusal.description), log: refusal.description)
        }
        var targetBytes = session.lendTargetBuffer()
        if strip > 0 {
            RouteTable.appendStripped(head.target, strip: strip, to: &targetBytes)
        } else {
            targetBytes.append(contentsOf: head.target)
        }
        // Stored at once, so that every path, a refusal too, gives the buffer back.
        upstreamTarget = targetBytes
        if let refusal = targetBytes.withUnsafeBufferPointer({ RequestTarget.checkBytes($0) }) {
            return refuse(.badRequest(refusal.description), log: refusal.description)
        }
        let violation = head.withFieldTable { table in RequestHygiene.check(table, isHTTP11: head.version == .http11) }
        if let violation { return refuse(.badRequest(violation.description), log: violation.description) }
        if targetBytes.first == UInt8(ascii: "/") && route.forwardsPathsUnchanged {
            // The common case, on the bytes: an origin-form target goes up as it came.
            if RequestTarget.hasDotSegment(targetBytes) {
                return refuse(.badRequest(RequestTarget.dotSegmentRefusal.description), log: RequestTarget.dotSegmentRefusal.description)
            }
            passthrough = route.hasPassthroughPaths && route.isPassthrough(String(decoding: targetBytes, as: UTF8.self))
        } else {
            let target: String
            switch route.targets.upstreamTarget(for: String(decoding: targetBytes, as: UTF8.self)) {
            case .success(let mapped): target = mapped
            case .failure(let refusal): return refuse(.badRequest(refusal.description), log: refusal.description)
            }
            targetBytes.removeAll(keepingCapacity: true)
            targetBytes.append(contentsOf: target.utf8)
            upstreamTarget = targetBytes
            passthrough = route.isPassthrough(target)
        }
        let admission = passthrough ? nil : context.coordinator.admit()
        admissionAtArrival = admission
        step { $0.start(admission: admission, now: now) }
        admissionAtArrival = nil
    }

    /// Refused before anything was forwarded; the connection closes after the answer (after a message we
    /// doubt, where the next one starts cannot be known).
    private func refuse(_ response: LocalResponse, log reason: String) {
        proxy.refused(reason)
        client.closeAfterResponse = true
        let now = EventLoop.monotonicNow
        step { $0.refuse(response, now: now) }
    }

    // MARK: - Client side

    /// A piece of a streamed body from the client.
    func streamedBodyReceived(_ bytes: UnsafeRawBufferPointer) {
        guard !finished else { return }
        streamed?.received(bytes)
    }

    func streamedBodyEnded() {
        guard !finished else { return }
        streamed?.clientFinished()
    }

    func clientCanSendMore() {
        guard upstreamReadingPaused, let upstream else { return resumeStreamReading() }
        upstreamReadingPaused = false
        upstream.resumeReading()
    }

    func clientGone() {
        let now = EventLoop.monotonicNow
        step { $0.clientGone(now: now) }
    }

    func refreshFinished(_ outcome: RefreshCoordinator.Outcome) {
        // A held request whose client shut its sending side meanwhile is not sent again: that FIN cannot be
        // told from a client that left, and the replay would act upstream for nobody. (A request that went
        // upstream at once is still answered after a half-close; so is a held one whose refresh failed.)
        if case .renewed = outcome, client.endIfPeerHalfClosed() { return }
        let now = EventLoop.monotonicNow
        step { $0.refreshFinished(outcome, now: now) }
    }

    func abandon() {
        let now = EventLoop.monotonicNow
        step { $0.abandon(now: now) }
    }
}
