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
/// The answers and the end live in RelayedExchange+Answers.swift, the HTTP/2 upstream side in
/// RelayedExchange+HTTP2Upstream.swift; the state they share is internal for that (Swift's `private` stops
/// at the file), and only the exchange's own files change it.
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
    private var passthrough = false
    /// The protocol a WebSocket-style handshake asks for (see `UpgradeTunnel`); nil for other requests.
    let upgradeProtocol: String?
    /// A slot of `limits.max_tunnels` taken for this handshake; it passes to the tunnel at the 101.
    var holdsTunnelSlot = false

    var lifecycle: RequestLifecycle
    private var queue = LifecycleActionQueue()
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

    // MARK: - Carrying out the machine's actions

    /// Feeds one event to the machine and carries out what it decides. The machine (a plain value) steps
    /// on a copy that is stored back before any action runs: the stored property is only ever read or
    /// assigned whole, never accessed across a call, so the compiler can prove its accesses exclusive and
    /// does not check them at run time on every event.
    ///
    /// `arriving`: the response head the event reports, for the one action that uses it (`relayResponse`
    /// or `captureResponse`). Passed along, not stored: valid during its callback only, and a stored
    /// optional head would cost a copy in and two generic destroys on every response.
    func step(arriving head: ReceivedResponseHead? = nil, _ event: (inout RequestLifecycle) -> RequestLifecycle.ActionList) {
        var machine = lifecycle
        let actions = event(&machine)
        lifecycle = machine
        execute(actions, arriving: head)
    }

    /// Actions that wait behind a running batch run after the callback that reported `head`: they see no
    /// head (the machine asks for it only in the step of `responseHead`).
    private func execute(_ actions: consuming RequestLifecycle.ActionList, arriving head: ReceivedResponseHead?) {
        guard queue.begin() else {
            // Joined and dropped here, outside the accesses to `queue` (see `LifecycleActionQueue`).
            var actions = actions
            if queue.hasWaiting {
                var waiting = queue.takeWaiting()
                waiting += actions
                swap(&waiting, &actions)
            }
            return queue.wait(&actions)
        }
        performEach(actions, arriving: head)
        while let batch = queue.next() { performEach(batch, arriving: head) }
    }

    private func performEach(_ actions: consuming RequestLifecycle.ActionList, arriving head: ReceivedResponseHead?) {
        // By index: an iterator would copy the whole list (actions are plain bytes now, so taking one is a copy).
        for index in 0..<actions.count {
            let action = actions.take(at: index)
            if queue.admits(action) { perform(action, of: actions, arriving: head) }
        }
    }

    /// `list`: the list the action came in, for what it names but does not carry (`answer`, `failure`).
    private func perform(_ action: RequestLifecycle.Action, of list: borrowing RequestLifecycle.ActionList, arriving head: ReceivedResponseHead?) {
        switch action {
        case .acquireConnection(let admittedEarlier): acquireConnection(lane: admittedEarlier ? .admitted : .arriving, fresh: false)
        case .acquireFreshConnection: acquireConnection(lane: .admitted, fresh: true)
        case .resendWithFreshProof:
            context.dpop?.countNonceReplay()
            acquireConnection(lane: .admitted, fresh: false)
        case .cancelConnectionWait:
            ticket?.cancel()
            ticket = nil
            http2?.cancelWait()
        case .send(let credential): send(credential)
        case .cancelUpstream: closeUpstream()
        case .releaseConnection: releaseUpstream()
        case .schedule(let timer, let seconds): schedule(timer, after: seconds)
        case .cancel(let timer): self.timer(timer)?.cancel()
        case .hold, .unhold, .consultRefreshRules, .reportUnreplayableRefreshTrigger, .countReplay, .upstreamFailed, .retrying:
            switch proxy.carryOut(action, failure: list.failure, for: self, context: context) {
            case .done: break
            case .holdRefused:
                let now = EventLoop.monotonicNow
                step { $0.holdRefused(now: now) }
            case .refreshRulesDecided(let decision):
                let now = EventLoop.monotonicNow
                step { $0.refreshRulesDecided(decision, now: now) }
            }
        case .captureResponse:
            if let head { captured = CapturedResponse(head: head) }
            // The 401 is read to its end before anything is decided: silence mid-body is bounded as when
            // relaying, or a stalled upstream would keep the client (and the connection) for ever.
            upstream?.setSilenceLimit(context.current.timeouts.streamIdleSeconds)
            http2?.stream?.setSilenceLimit(context.current.timeouts.streamIdleSeconds)
        case .relayResponse:
            if let head { startRelaying(head) }
        case .endRelayedResponse:
            if let trailers = http2?.trailers, !trailers.isEmpty { client.finishResponse(trailers: trailers) } else { client.finishResponse() }
        case .respondCaptured: respondCaptured()
        case .respond:
            if let answer = list.answer { respond(answer) }
        case .abortClient: client.close()
        case .finish:
            // Set by the step that yielded `finish`; the machine takes no event after it.
            if let summary = lifecycle.summary { finish(summary) }
        }
    }

    private func schedule(_ timer: RequestLifecycle.Timer, after seconds: Double) {
        if let event = self.timer(timer) { return event.schedule(after: seconds) }
        let event = session.lendDeadlineTimer()
        event.exchange = self
        event.kind = timer
        switch timer {
        case .poolWait: poolWaitTimer = event
        case .connect: connectTimer = event
        case .responseHead: responseHeadTimer = event
        case .hold: holdTimer = event
        }
        event.schedule(after: seconds)
    }

    private func timer(_ timer: RequestLifecycle.Timer) -> DeadlineTimer? {
        switch timer {
        case .poolWait: poolWaitTimer
        case .connect: connectTimer
        case .responseHead: responseHeadTimer
        case .hold: holdTimer
        }
    }

    func deadlinePassed(_ timer: RequestLifecycle.Timer) {
        // The connect deadline bounds the connect only: a connection that is up may take its time to answer.
        if timer == .connect, upstream?.isConnected ?? true { return }
        let now = EventLoop.monotonicNow
        step { $0.timerFired(timer, now: now) }
    }

    // MARK: - Upstream connection

    /// `lane`: a request released by a refresh was admitted already and queues in order, never refused
    /// by the waiter bound meant for new arrivals. The wait itself is bounded by the machine's deadline.
    func acquireConnection(lane: HTTPTransport.UpstreamPool.Lane, fresh: Bool) {
        if let http2Pool = route.http2Pool, !http2Pool.serverChoseHTTP1 { return acquireStream(http2Pool, lane: lane) }
        let pool = route.pool
        if !fresh, let connection = pool.takeIdleConnection() { return connectionGranted(connection) }
        let ready: HTTPTransport.UpstreamPool.Grant = { [weak self] result in
            guard let self, !self.finished else {
                if case .success(let connection) = result { pool.release(connection) }
                return
            }
            self.ticket = nil
            let now = EventLoop.monotonicNow
            switch result {
            case .success(let connection): self.connectionGranted(connection)
            case .failure(.tooManyWaiters): self.step { $0.connectionRefused(now: now) }
            case .failure(let failure):
                let failure = RequestLifecycle.UpstreamFailure(kind: .connect, responseStarted: false, description: failure.description)
                self.step { $0.upstreamFailed(failure, now: now) }
            }
        }
        let ticket = fresh ? pool.acquireFresh(lane: lane, ready) : pool.acquire(lane: lane, ready)
        if ticket.isWaiting {
            self.ticket = ticket
            step { $0.connectionQueued() }
        }
    }

    /// The token is read now, not at arrival: a refresh may have finished while we waited.
    private func connectionGranted(_ connection: HTTPClientConnection) {
        upstream = connection
        let admission = lifecycle.passthrough ? nil : admissionAtArrival.take() ?? context.coordinator.admit()
        if case .send(_, let authorization) = admission { grantedAuthorization = authorization }
        let reused = connection.requestsStarted > 0, now = EventLoop.monotonicNow
        step { $0.connectionAcquired(reused: reused, admission: admission, now: now) }
    }

    private func send(_ credential: RequestLifecycle.Credential) {
        guard let upstream else { return sendOnStream(credential) }
        sentAt = EventLoop.monotonicNow
        captured = nil
        upstream.handler = session   // which passes the reports on to this exchange (see ClientSession)
        upstream.setSilenceLimit(nil)
        switch body {
        case .kept(let bytes):
            // A POST, PUT or PATCH always says how long its body is, even when it is empty.
            let announcesLength = !bytes.isEmpty || head.method == .post || head.method == .put || head.method == .patch
            upstream.startRequest(method: upstreamMethod, target: upstreamTarget, body: announcesLength ? .known(bytes.count) : .none,
                                  upgrade: upgradeProtocol) { writeForwardedFields(into: &$0, credential) }
            if !bytes.isEmpty { upstream.sendBody(bytes) }
            upstream.finishRequest()
        case .streamed(let streamed):
            // The client is held back (its body waits in its socket), so the loop does not see it leave:
            // one that left while the request queued or was held must not get a head sent upstream (with
            // a fresh token) for a body that will never come. Ending it reports `clientGone` (499).
            if client.endIfPeerLeftWhilePaused() { return }
            // Sent with `Expect: 100-continue` whether or not the client asked: a 401 then comes before the
            // body leaves, and the request can still be replayed. The body flows from the upstream's 100
            // or the end of the wait (`connectionCanSendMore`).
            upstream.startRequest(method: upstreamMethod, target: upstreamTarget, body: streamed.length,
                                  continueWait: context.timeouts.continueSeconds) { writeForwardedFields(into: &$0, credential) }
            streamed.attach(upstream)
        }
    }

    /// The method as the upstream request names it: a literal for the standard methods (the parser matched
    /// their bytes exactly), so that no String is made from the head's bytes for every send.
    var upstreamMethod: String {
        switch head.method {
        case .get: "GET"
        case .head: "HEAD"
        case .post: "POST"
        case .put: "PUT"
        case .delete: "DELETE"
        case .options: "OPTIONS"
        case .patch: "PATCH"
        case .connect, .trace, .other: head.methodName
        }
    }

    /// The upstream request's fields, written straight into its head from the client's bytes: the client's
    /// end-to-end fields (`HeaderPolicy`), the forwarding fields (`ForwardingHeaders`), `Host`, and the token.
    /// Recomputed for each send (a replay is rare; keeping a copy would cost every request).
    func writeForwardedFields(into block: inout HTTPFieldBlock, _ credential: RequestLifecycle.Credential) {
        let keepAuthorization = passthrough
        // The running configuration's: a replay after a reload follows it.
        let forwarding = context.current.forwarding
        // Read field by field below: a copy of the whole `InjectSettings` would retain each of its strings.
        let context = self.context
        head.withFieldTable { table in
            ASCII.withBytes(of: context.injection.headerKey) { injectedHeader in
                ForwardingHeaders.write(table, forwarded: { index in
                    HeaderPolicy.forwardsRequestField(index, of: table, keepAuthorization: keepAuthorization, injectedHeader: injectedHeader)
                }, client: session.forwardedClient, settings: forwarding, into: &block)
            }
        }
        if let host = context.route.hostField { block.append(host) }
        if case .token = credential, let authorization = grantedAuthorization, let token = context.tokenField.field(for: authorization) {
            block.append(token)
            // A DPoP-bound token goes with a fresh proof for this very send (a replay or resend too: new jti, iat, nonce).
            if let dpop = context.dpop, authorization.utf8.starts(with: DPoPProofs.authorizationScheme.utf8),
               let proof = dpop.proof(method: upstreamMethod, target: upstreamTarget, server: context.dpopOrigin, authorization: authorization) {
                block.append(name: "DPoP", value: proof)
            }
        }
    }

    /// Gives the connection back; the pool closes it unless the response left it clean.
    private func releaseUpstream() {
        guard let upstream else { return releaseStream() }
        self.upstream = nil
        streamed?.detach()
        upstream.handler = nil
        upstream.setSilenceLimit(nil)
        if upstreamReadingPaused {
            upstreamReadingPaused = false
            upstream.resumeReading()
        }
        route.pool.release(upstream)
    }

    /// Stops the request in flight: the connection is closed, never reused with half a response in it.
    func closeUpstream() {
        guard let upstream else { return releaseStream() }
        self.upstream = nil
        streamed?.detach()
        upstream.handler = nil
        upstream.close()
    }

    // MARK: - Upstream callbacks

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}

    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        guard connection === upstream else { return }
        upstreamReceivedHead(head, bodyBytesSent: connection.bodyBytesSentBeforeResponse)
    }

    /// A response head from the upstream, either protocol: the refresh decision and the machine's event.
    /// `bodyBytesSent`: body bytes of a streamed request that had left before it.
    func upstreamReceivedHead(_ head: ReceivedResponseHead, bodyBytesSent: Int) {
        if http2?.headLatencyRecorded != true { context.metrics.upstreamLatency.record(EventLoop.monotonicNow - sentAt) }
        // Nobody asked to switch protocols: what follows is not HTTP, and must not reach the client as such.
        if head.status == 101 && upgradeProtocol == nil {
            closeUpstream()
            let failure = RequestLifecycle.UpstreamFailure(kind: .invalidResponse, responseStarted: true,
                                                           description: "invalid HTTP response: interim 101 to a request that did not ask for an upgrade")
            let now = EventLoop.monotonicNow
            return step { $0.upstreamFailed(failure, now: now) }
        }
        // The transport's count is the truth about the body: a byte handed to the socket may have been read.
        if streamed != nil && bodyBytesSent > 0 {
            var machine = lifecycle
            machine.streamedBodyStarted()
            lifecycle = machine
        }
        if let dpop = context.dpop, !passthrough, noteNonce(head, dpop), head.status == 401 {
            var challenges: [String] = []
            head.withFieldTable { table in
                for index in 0..<table.count where table.nameIs(index, "www-authenticate") {
                    challenges.append(String(decoding: table.value(index), as: UTF8.self))
                }
            }
            if RefreshTrigger.isNonceChallenge(status: head.status, challenges: challenges) {
                return step(arriving: head) { $0.nonceChallenged(status: head.status) }
            }
        }
        // Challenges are read only for a refresh-triggering status: most responses are not one. The running
        // configuration's statuses, as before the context existed.
        let running = context.current
        var expired = false
        if running.triggerStatusSet.contains(head.status) {
            var challenges: [String] = []
            head.withFieldTable { table in
                for index in 0..<table.count where table.nameIs(index, "www-authenticate") {
                    challenges.append(String(decoding: table.value(index), as: UTF8.self))
                }
            }
            expired = RefreshTrigger.indicatesExpiredToken(status: head.status, challenges: challenges,
                                                           triggerStatuses: running.triggerStatuses)
        }
        // A gRPC answer that ended with no message (HTTP/2 upstreams only; its head was withheld until then):
        // its status is in the trailers it ended with (Trailers-Only: the head's own fields), and decides like
        // a 401 (`RequestLifecycle+GRPC`); an HTTP status that triggers (a gateway's bare 401) still does.
        if let early = trailersBeforeData, http2?.isGRPC == true {
            let refused = expired || GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: early.field("grpc-status"),
                                                                              triggerStatuses: running.triggerGRPCStatuses)
            return step(arriving: head) { $0.grpcStatusBeforeMessage(status: head.status, indicatesExpiredToken: refused) }
        }
        step(arriving: head) { $0.responseHead(status: head.status, indicatesExpiredToken: expired) }
    }

    /// Keeps the upstream's latest `DPoP-Nonce` (RFC 9449 §9: any response may bring one); whether one was accepted.
    private func noteNonce(_ head: ReceivedResponseHead, _ dpop: DPoPProofs) -> Bool {
        var accepted = false
        let origin = context.dpopOrigin
        head.withFieldTable { table in
            for index in 0..<table.count where table.nameIs(index, "dpop-nonce") {
                accepted = dpop.received(nonce: table.value(index), from: origin)
            }
        }
        return accepted
    }

    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        guard connection === upstream else { return }
        upstreamReceivedBody(bytes)
    }

    /// A piece of the response body, either protocol: kept (a 401 for a replay) or relayed.
    func upstreamReceivedBody(_ bytes: UnsafeRawBufferPointer) {
        switch lifecycle.phase {
        case .capturing:
            guard let captured else { break }
            let room = Self.maxCapturedBodyBytes - captured.body.count
            if room > 0 { captured.body.append(contentsOf: bytes.prefix(room)) }
        case .relaying:
            client.sendBody(bytes)
            // The client is slower than the upstream: stop reading the upstream until it has drained.
            if !client.canSendMore && !upstreamReadingPaused {
                upstreamReadingPaused = true
                upstream?.pauseReading()
                http2?.stream?.pauseReading()
            }
        default:
            break
        }
    }

    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        guard connection === upstream else { return }
        let now = EventLoop.monotonicNow
        step { $0.responseEnded(now: now) }
    }

    func connectionCanSendMore(_ connection: HTTPClientConnection) {
        guard connection === upstream, !finished else { return }
        streamed?.upstreamCanTakeMore(connection)
    }

    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        guard connection === upstream else { return }
        // "alpn": the server now selects h2; the machine's fresh-connection retry takes the HTTP/2 path.
        if connection.serverSelectedHTTP2 { route.http2Pool?.serverMaySpeakHTTP2() }
        var failure = TransportUpstream.failure(ended, responseStarted: responseStarted, connected: connection.isConnected)
        if let status = connection.statusUnreadAtFailure {
            // Still a 502 (the answer was not read), but the log says what the upstream meant.
            failure.description += " (the upstream had answered \(status) and closed without reading the rest of the request body)"
        }
        upstream = nil
        streamed?.detach()
        connection.handler = nil
        let now = EventLoop.monotonicNow
        // A head still waiting for its first body piece has not reached the client: it gets a 502 instead.
        let unsent = lifecycle.phase == .relaying && client.withdrawUnsentResponse()
        step { $0.upstreamFailed(failure, responseUnsent: unsent, now: now) }
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
