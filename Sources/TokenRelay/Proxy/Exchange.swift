import CEventShim
import CLibevent

/// One client request, from arrival to answer: the proxy path and the 401 path as one state machine.
///
/// ```
/// begin ─▶ admit ─┬─ send ─▶ awaitingResponse ─┬─ non-401, or 401 on a replay ─▶ streaming ─▶ done
///                 │                            ├─ 401 on its first send ─▶ capturing401 ─▶ (coordinator decides)
///                 │                            │        replay: token already renewed ─▶ send again
///                 │                            │        hold: refresh started/joined ─▶ held
///                 │                            │        passThrough: login required ─▶ captured 401 ─▶ done
///                 │                            └─ failure before a response ─▶ 502 / 504 ─▶ done
///                 ├─ hold (a refresh is running) ─▶ held ─┬─ renewed ─▶ send (the replay)
///                 │                                       ├─ rejected ─▶ captured 401, or local 401 ─▶ done
///                 │                                       └─ unavailable / hold timeout ─▶ 503 ─▶ done
///                 └─ login required ─▶ local 401 ─▶ done
/// client hang-up at any point ─▶ cancel the upstream request, drop everything ─▶ done
/// ```
///
/// A request is replayed at most once after a 401, so a token the upstream keeps rejecting can never
/// make a loop. The body is kept in our own `evbuffer` until the exchange ends, because a replay needs
/// it byte for byte.
///
/// Lifetime: the exchange retains itself in `begin()` and releases in `finish()`, which runs exactly
/// once and first removes every libevent registration that points at it.
final class Exchange: OutgoingRequestDelegate {
    private enum Phase {
        case admitted
        case waitingForConnection
        case awaitingResponse
        case capturing401
        case held
        case streaming
        case finished
    }

    /// A client that has not drained this much of the response makes us stop reading the upstream.
    private static let clientBacklogLimit = 256 * 1024

    private unowned let proxy: ProxyServer
    /// The upstream and pool this request uses from arrival to answer, whatever a reload changes meanwhile.
    private let route: UpstreamRoute
    /// The header that carries the token, as of arrival: the client's own copy of it was dropped then,
    /// so a reload naming another header must not make this request send two.
    private let injection: InjectSettings
    private let clientRequest: OpaquePointer
    private let clientConnection: OpaquePointer?
    private let method: evhttp_cmd_type
    private let isHTTP10: Bool
    private var target = "/"
    /// Forwarded untouched: no token injected, no refresh on its 401.
    private var passthrough = false
    private var forwardedHeaders: [(name: String, value: String)] = []
    private var body: OpaquePointer?

    private var phase = Phase.admitted
    private var sends = 0
    private let arrivedAt = EventLoop.monotonicNow
    private var sentAt = 0.0
    private var heldSince: Double?
    /// The client's request target, copied only when the access log is on (the request may be freed
    /// before the exchange finishes).
    private var accessLogTarget: String?
    private var sentGeneration: UInt64 = 0
    private var call: OutgoingRequest?
    private var connection: OpaquePointer?
    private var connectWatchdog: ConnectWatchdog?
    /// Bounds the wait for the response head as a whole: evhttp's own timeout restarts with every byte,
    /// so an upstream dripping its head one byte at a time would never time out.
    private var responseHeadTimer: LoopEvent?
    private var sentOnReusedConnection = false
    private var retried = false
    private var retryTimer: LoopEvent?
    private var poolWaitTimer: LoopEvent?
    private var captured: CapturedResponse?
    private var holdDeadline: Double?
    private var holdTimer: LoopEvent?
    /// Non-nil exactly while our close callback and EV_CLOSED watcher are registered on the client connection.
    private var hangUpWatcher: LoopEvent?
    private var upstreamReadingPaused = false
    private var answeredStatus: Int32 = 0
    /// The answer is the upstream's response (streamed), not one tokenrelay wrote.
    private var answeredByUpstream = false
    private var selfRetain: Unmanaged<Exchange>?

    init(proxy: ProxyServer, request: OpaquePointer) {
        self.proxy = proxy
        route = proxy.route
        injection = proxy.config.inject
        clientRequest = request
        clientConnection = evhttp_request_get_connection(request)
        method = evhttp_request_get_command(request)
        isHTTP10 = tr_evhttp_request_minor(request) == 0
    }

    // MARK: - Arrival

    func begin() {
        selfRetain = Unmanaged.passRetained(self)
        var admission = ClientConnections.Admission.admitted
        if let clientConnection {
            admission = proxy.clientConnections.attach(self, to: clientConnection)
            // evhttp stops reading a connection while its request is with us, so it would not notice a
            // client that hangs up during a hold; EV_CLOSED does.
            let fd = bufferevent_getfd(evhttp_connection_get_bufferevent(clientConnection))
            let watcher = LoopEvent(loop: proxy.loop, fd: fd, events: Int32(EV_CLOSED)) { [unowned self] _ in self.clientHungUp() }
            watcher.schedule()
            hangUpWatcher = watcher
        }
        let rawTargetPointer = evhttp_request_get_uri(clientRequest)
        let rawTargetBytes = rawTargetPointer.map { UnsafeBufferPointer(start: UnsafeRawPointer($0).assumingMemoryBound(to: UInt8.self),
                                                                        count: strlen($0)) }
        let rawTarget = rawTargetBytes.map { String(decoding: $0, as: UTF8.self) } ?? ""
        if proxy.config.accessLog.enabled { accessLogTarget = rawTarget }
        switch admission {
        case .admitted: break
        case .overLimit: return replyAndClose(.tooManyConnections)
        case .nulInHead: return refuse("NUL byte in the request head")
        case .headTooLarge:
            proxy.refused("request head over limits.max_header_bytes")
            return replyAndClose(.headTooLarge)
        }
        if method == EVHTTP_REQ_CONNECT { return refuse(nil) }
        // RFC 9110 §9.3.8: no credentials in a TRACE, and an upstream that echoes it would hand the
        // injected token to the client.
        if method == EVHTTP_REQ_TRACE {
            proxy.refused("TRACE")
            return replyAndClose(.traceRefused)
        }
        // evhttp answers any HTTP/1.x in kind, HTTP/1.2 included; only 1.0 and 1.1 exist.
        if tr_evhttp_request_major(clientRequest) != 1 || tr_evhttp_request_minor(clientRequest) > 1 {
            proxy.refused("unsupported HTTP version")
            tr_evhttp_request_answer_as_http11(clientRequest)
            return replyAndClose(.versionNotSupported)
        }
        if let refusal = RequestTarget.checkBytes(rawTargetBytes ?? UnsafeBufferPointer(start: nil, count: 0)) {
            return refuse(refusal.description)
        }
        let clientHeaders = HeaderList(raw: evhttp_request_get_input_headers(clientRequest)).entries
        if let violation = RequestHygiene.check(clientHeaders, isHTTP11: !isHTTP10) { return refuse(violation.description) }
        switch route.targets.upstreamTarget(for: rawTarget) {
        case .success(let target): self.target = target
        case .failure(let refusal): return refuse(refusal.description)
        }
        passthrough = route.isPassthrough(target)
        forwardedHeaders = ForwardingHeaders.apply(
            to: HeaderPolicy.forwardedRequestHeaders(clientHeaders, keepAuthorization: passthrough, injectedHeader: injection.headerKey),
            clientAddress: clientAddress, settings: proxy.config.forwarding)
        // Take the body out of evhttp's request into a buffer we own for every attempt.
        let input = evhttp_request_get_input_buffer(clientRequest)
        if EvBuffer.length(input) > 0, let owned = evbuffer_new() {
            evbuffer_add_buffer(owned, input)
            body = owned
        }
        admit()
    }

    /// The client's IP address, for `X-Forwarded-For`.
    private var clientAddress: String? {
        guard let clientConnection else { return nil }
        var address: UnsafeMutablePointer<CChar>?
        var port: UInt16 = 0
        evhttp_connection_get_peer(clientConnection, &address, &port)
        return address.map { String(cString: $0) }
    }

    /// Ambiguous or foreign requests (nil: CONNECT): answered 400 (405) and never forwarded. The
    /// connection is closed after the answer: after a message whose framing we doubt, we cannot know
    /// where the next one starts (RFC 9112 §6.3).
    /// evhttp decides about closing from the *input* headers, and for requests it takes for proxy
    /// requests (CONNECT, foreign absolute-form) from `Proxy-Connection` only, hence both there.
    private func refuse(_ reason: String?) {
        proxy.refused(reason ?? "CONNECT")
        replyAndClose(reason.map { .badRequest($0) } ?? .connectRefused)
    }

    private func replyAndClose(_ response: LocalResponse) {
        let input = HeaderList(raw: evhttp_request_get_input_headers(clientRequest))
        input.add("Connection", "close")
        input.add("Proxy-Connection", "close")
        HeaderList(raw: evhttp_request_get_output_headers(clientRequest)).add("Connection", "close")
        reply(response)
    }

    private func admit() {
        if passthrough { return acquireConnection() }
        switch proxy.coordinator.admit() {
        case .send: acquireConnection()
        case .hold: hold()
        case .loginRequired: reply(.loginRequired)
        case .unavailable(let retryAfter): reply(.refreshOnHold(retryAfter: retryAfter))
        }
    }

    // MARK: - Sending

    /// A request waits for a pooled connection only so long, and only so many wait: a stalled upstream
    /// must turn into quick 503s, not into an unbounded queue of clients.
    private func acquireConnection() {
        phase = .waitingForConnection
        // A request that was held has been admitted already (limits.max_held_requests): when a refresh
        // releases a thousand at once they queue for connections in order, none is refused by the
        // waiter bound meant for new arrivals.
        let acquisition = route.pool.acquire(for: self, admittedBefore: heldSince != nil) { [unowned self] connection in
            self.poolWaitTimer = nil
            self.send(on: connection)
        }
        switch acquisition {
        case .ready(let connection):
            send(on: connection)
        case .queued:
            let timer = LoopEvent(loop: proxy.loop) { [unowned self] _ in
                self.poolWaitTimer = nil
                self.route.pool.cancelWait(for: self)
                self.reply(.poolExhausted("timed out waiting for a free upstream connection"))
            }
            timer.schedule(after: proxy.config.timeouts.poolWaitSeconds)
            poolWaitTimer = timer
        case .full:
            reply(.poolExhausted("too many requests are waiting for an upstream connection"))
        }
    }

    /// Sends with the token current *now*: a refresh may have finished while we waited for a connection.
    private func send(on connection: OpaquePointer) {
        let admission = passthrough ? .send(generation: 0, authorization: "") : proxy.coordinator.admit()
        guard phase == .waitingForConnection, case .send(let generation, let authorization) = admission else {
            route.pool.release(connection)
            if phase == .waitingForConnection { admit() }
            return
        }
        self.connection = connection
        let reused = route.pool.willSend(on: connection)
        sentOnReusedConnection = reused
        sends += 1
        sentAt = EventLoop.monotonicNow
        sentGeneration = generation
        captured = nil
        phase = .awaitingResponse
        let call = OutgoingRequest(delegate: self)
        self.call = call
        let started = call.start(on: connection, method: method, target: target) { request in
            let headers = HeaderList(raw: evhttp_request_get_output_headers(request))
            for header in forwardedHeaders { headers.add(header.name, header.value) }
            headers.add("Host", route.upstream.authority)
            if !passthrough { headers.add(injection.header, authorization) }
            let length = EvBuffer.length(body)
            // evhttp adds Content-Length only for POST and PUT (docs/evhttp.md, content-length); framing is ours.
            if length > 0 || method == EVHTTP_REQ_POST || method == EVHTTP_REQ_PUT || method == EVHTTP_REQ_PATCH {
                headers.add("Content-Length", String(length))
            }
            // Referenced, not copied; never reference an empty buffer (docs/evhttp.md, empty-reference).
            if length > 0, let body { evbuffer_add_buffer_reference(evhttp_request_get_output_buffer(request), body) }
        }
        if started {
            let timer = LoopEvent(loop: proxy.loop) { [unowned self] _ in self.responseHeadTimedOut() }
            timer.schedule(after: proxy.config.timeouts.upstreamSeconds)
            responseHeadTimer = timer
        }
        if started && !reused {
            connectWatchdog = ConnectWatchdog(loop: proxy.loop, connection: connection, seconds: proxy.config.timeouts.connectSeconds) {
                [unowned self] in self.connectTimedOut()
            }
        }
        if !started {
            self.call = nil
            self.connection = nil
            route.pool.release(connection)
            upstreamFailed(OutgoingFailure(kind: .connect, afterResponseStarted: false))
        }
    }

    // MARK: - Upstream response

    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer) {
        connectWatchdog = nil
        responseHeadTimer = nil
        proxy.metrics.upstreamLatency.record(EventLoop.monotonicNow - sentAt)
        if let connection { route.pool.responseStarted(on: connection) }
        if sends == 1 && !passthrough && RefreshTrigger.indicatesExpiredToken(
            status: Int(evhttp_request_get_response_code(response)),
            challenges: HeaderList(raw: evhttp_request_get_input_headers(response)).values("WWW-Authenticate"),
            triggerStatuses: proxy.config.refresh.triggerStatuses) {
            phase = .capturing401
            captured = CapturedResponse(response: response)
        } else {
            startStreaming(response)
        }
    }

    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer) {
        let input = evhttp_request_get_input_buffer(response)!
        switch phase {
        case .capturing401: captured?.append(from: input)
        case .streaming: relay(input)
        default: evbuffer_drain(input, EvBuffer.length(input))
        }
    }

    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>) {
        self.call = nil
        connectWatchdog = nil
        responseHeadTimer = nil
        if case .failure(let failure) = result, phase == .awaitingResponse, !retried,
           RetryPolicy.mayRetry(failure, method: method, sentOnReusedConnection: sentOnReusedConnection) {
            return retryOnFreshConnection(after: failure)
        }
        returnConnection()
        switch (result, phase) {
        case (.success, .capturing401): unauthorized()
        case (.success, _): endStreaming()
        case (.failure(let failure), .streaming):
            // Headers are out: a truncated response is the honest answer.
            proxy.upstreamFailed(failure)
            abortClient(flushingFirst: true)
        case (.failure(let failure), _): upstreamFailed(failure)
        }
    }

    private func returnConnection() {
        guard let connection else { return }
        self.connection = nil
        if upstreamReadingPaused {
            upstreamReadingPaused = false
            bufferevent_enable(evhttp_connection_get_bufferevent(connection), Int16(EV_READ))
        }
        route.pool.release(connection)
    }

    /// evhttp has already reset the failed connection, so its next request connects afresh: the retry
    /// goes out on it (not on another idle connection that may be just as stale), from a timer rather
    /// than inside the connection's own callback. It does not count as a send for the 401 rules.
    private func retryOnFreshConnection(after failure: OutgoingFailure) {
        retried = true
        sends -= 1
        phase = .waitingForConnection
        proxy.logger.info("retrying on a fresh upstream connection", metadata: ["reason": "\(failure)"])
        let timer = LoopEvent(loop: proxy.loop) { [unowned self] _ in
            self.retryTimer = nil
            guard let connection = self.connection else { return }
            self.connection = nil
            self.send(on: connection)
        }
        timer.schedule(after: 0)
        retryTimer = timer
    }

    /// No complete response head within `timeouts.upstream_seconds` of sending: 504, and the connection
    /// is reset by the cancel (never reused with a half-read head in it).
    private func responseHeadTimedOut() {
        responseHeadTimer = nil
        connectWatchdog = nil
        call?.cancel()
        call = nil
        returnConnection()
        upstreamFailed(OutgoingFailure(kind: .timeout, afterResponseStarted: false))
    }

    /// No TCP connection within `timeouts.connect_seconds`: give the request up (the cancel also stops
    /// evhttp's connect attempt).
    private func connectTimedOut() {
        connectWatchdog = nil
        responseHeadTimer = nil
        call?.cancel()
        call = nil
        returnConnection()
        upstreamFailed(OutgoingFailure(kind: .connectTimeout, afterResponseStarted: false))
    }

    private func upstreamFailed(_ failure: OutgoingFailure) {
        proxy.upstreamFailed(failure)
        let timedOut = failure.kind == .timeout || failure.kind == .connectTimeout
        reply(timedOut ? .gatewayTimeout : .badGateway("upstream \(failure)"))
    }

    // MARK: - The 401 path

    private func unauthorized() {
        switch proxy.coordinator.unauthorized(sentGeneration: sentGeneration) {
        case .replay:
            proxy.metrics.replaysStaleGeneration.increment()
            acquireConnection()
        case .hold:
            hold()
        case .passThrough:
            replyCaptured401()
        case .unavailable(let retryAfter):
            reply(.refreshOnHold(retryAfter: retryAfter))
        }
    }

    private func hold() {
        guard proxy.hold(self) else { return reply(.tooManyHeld) }
        phase = .held
        let now = EventLoop.monotonicNow
        if heldSince == nil { heldSince = now }
        let deadline = holdDeadline ?? now + proxy.config.timeouts.holdSeconds
        holdDeadline = deadline
        let timer = LoopEvent(loop: proxy.loop) { [unowned self] _ in
            self.reply(.unavailable("timed out waiting for a token refresh"))
        }
        timer.schedule(after: max(0, deadline - now))
        holdTimer = timer
    }

    /// Hold duration runs from the first hold to the answer (not to the end of the refresh), so a slow
    /// replay or a 503 after the hold shows in it, labelled by how the request ended.
    private func recordHoldEnded() {
        guard let since = heldSince else { return }
        heldSince = nil
        let outcome: RelayMetrics.HoldOutcome = switch answeredStatus {
        case 0: .clientGone
        case _ where answeredByUpstream: .replayed
        case 503: .unavailable
        case 401: .unauthorized
        default: .other
        }
        proxy.metrics.recordHold(seconds: EventLoop.monotonicNow - since, outcome: outcome)
    }

    /// Called by the proxy for every held exchange when a refresh cycle ends.
    func refreshFinished(_ outcome: RefreshCoordinator.Outcome) {
        guard phase == .held else { return }
        holdTimer = nil
        switch outcome {
        case .renewed:
            if sends > 0 { proxy.metrics.replaysAfterRefresh.increment() }
            acquireConnection()
        case .rejected:
            if captured != nil { replyCaptured401() } else { reply(.loginRequired) }
        case .unavailable:
            reply(.unavailable("no valid access token could be obtained; try again later"))
        }
    }

    // MARK: - Streaming to the client

    private func startStreaming(_ response: OpaquePointer) {
        phase = .streaming
        answeredByUpstream = true
        answeredStatus = evhttp_request_get_response_code(response)
        let upstreamHeaders = HeaderList(raw: evhttp_request_get_input_headers(response)).entries
        let output = HeaderList(raw: evhttp_request_get_output_headers(clientRequest))
        for header in HeaderPolicy.forwardedResponseHeaders(upstreamHeaders) { output.add(header.name, header.value) }
        prepareClientFraming(hasLength: upstreamHeaders.contains { HTTPSyntax.isField($0.name, "content-length") })
        let reason = evhttp_request_get_response_code_line(response).map { String(cString: $0) } ?? ""
        evhttp_send_reply_start(clientRequest, answeredStatus, reason)
    }

    /// An HTTP/1.0 keep-alive client cannot be sent a body of unknown length: evhttp would announce
    /// `Content-Length: 0` and then send the body (docs/evhttp.md, http10-framing). Forgetting the client's keep-alive wish
    /// makes evhttp close after the body instead. While draining, every client is told to go away.
    private func prepareClientFraming(hasLength: Bool) {
        if isHTTP10 && !hasLength {
            HeaderList(raw: evhttp_request_get_input_headers(clientRequest)).removeAll("Connection")
        }
        // Draining, or a client is waiting for a connection slot: close this one after its answer.
        if proxy.isDraining || proxy.clientConnections.wantsSlotsBack {
            HeaderList(raw: evhttp_request_get_output_headers(clientRequest)).add("Connection", "close")
        }
    }

    /// Moves a piece of the upstream body to the client. evhttp has no flow control of its own: when the
    /// client falls behind, stop reading the upstream until the client has drained (docs/evhttp.md, flow-control).
    private func relay(_ input: OpaquePointer) {
        guard let clientConnection, let connection else { return }
        let backlog = EvBuffer.length(bufferevent_get_output(evhttp_connection_get_bufferevent(clientConnection)))
        if upstreamReadingPaused || backlog + EvBuffer.length(input) > Self.clientBacklogLimit {
            if !upstreamReadingPaused {
                upstreamReadingPaused = true
                bufferevent_disable(evhttp_connection_get_bufferevent(connection), Int16(EV_READ))
            }
            // Every chunk sent while paused must carry the callback: evhttp keeps only the last one given,
            // and a plain send would clear it, leaving the upstream paused for good.
            evhttp_send_reply_chunk_with_cb(clientRequest, input, clientDrainedTrampoline, unretainedContext(self))
        } else {
            evhttp_send_reply_chunk(clientRequest, input)
        }
    }

    func clientDrained() {
        guard upstreamReadingPaused, let connection else { return }
        upstreamReadingPaused = false
        bufferevent_enable(evhttp_connection_get_bufferevent(connection), Int16(EV_READ))
    }

    private func endStreaming() {
        detachFromClient()
        proxy.willSendFinalResponse(clientRequest)
        evhttp_send_reply_end(clientRequest)
        finish()
    }

    // MARK: - Answers

    private func reply(_ response: LocalResponse) {
        if response.status == 503 { proxy.answeredUnavailable(response) }
        let output = HeaderList(raw: evhttp_request_get_output_headers(clientRequest))
        for header in response.headers { output.add(header.name, header.value) }
        send(status: response.status, reason: response.reason, body: Array(response.body.utf8))
    }

    private func replyCaptured401() {
        guard let captured else { return reply(.loginRequired) }
        let output = HeaderList(raw: evhttp_request_get_output_headers(clientRequest))
        // Content-Length is recomputed: the kept body may be shorter than the original.
        for header in HeaderPolicy.forwardedResponseHeaders(captured.headers) where !HTTPSyntax.isField(header.name, "content-length") {
            output.add(header.name, header.value)
        }
        send(status: captured.status, reason: captured.reason, body: captured.body)
    }

    private func send(status: Int32, reason: String, body: [UInt8]) {
        answeredStatus = status
        prepareClientFraming(hasLength: true)
        detachFromClient()
        let buffer = evbuffer_new()!
        EvBuffer.append(buffer, body)
        proxy.willSendFinalResponse(clientRequest)
        evhttp_send_reply(clientRequest, status, reason, method == EVHTTP_REQ_HEAD ? nil : buffer)
        evbuffer_free(buffer)
        finish()
    }

    // MARK: - Client going away

    /// EV_CLOSED on the client's socket: nobody is left to answer.
    private func clientHungUp() {
        guard phase != .finished else { return }
        detachFromClient()
        if let clientConnection { evhttp_connection_free(clientConnection) }  // also frees the request
        finish()
    }

    /// evhttp is freeing the client connection (hang-up noticed on a write, or a timeout); called by
    /// `ClientConnections`, which owns the connection's close callback.
    func clientConnectionClosed() {
        guard phase != .finished else { return }
        hangUpWatcher = nil  // the connection is being freed: nothing left to unregister
        // A request evhttp detached from its failed connection is ours to free; one still attached is
        // freed by evhttp right after this callback.
        if evhttp_request_get_connection(clientRequest) == nil { evhttp_request_free(clientRequest) }
        finish()
    }

    /// The upstream died after we started the response: cut the client's connection so it sees a
    /// truncated response, never a clean end.
    /// `flushingFirst`: what is queued for the client (the head, the body so far) is written out before
    /// the close, with one non-blocking write, so the client sees a response cut short rather than no
    /// response at all. The socket is non-blocking; whatever does not fit is lost with the close.
    private func abortClient(flushingFirst: Bool = false) {
        detachFromClient()
        if let clientConnection {
            if flushingFirst, let bev = evhttp_connection_get_bufferevent(clientConnection), let output = bufferevent_get_output(bev),
               EvBuffer.length(output) > 0 {
                _ = evbuffer_write(output, bufferevent_getfd(bev))
            }
            evhttp_connection_free(clientConnection)
        }
        finish()
    }

    /// Removes our registrations on the client connection; must precede anything that may free it, and
    /// must not touch the connection afterwards (it may be gone).
    private func detachFromClient() {
        guard hangUpWatcher != nil, let clientConnection else { return }
        hangUpWatcher = nil
        proxy.clientConnections.detach(from: clientConnection)
    }

    private func finish() {
        guard phase != .finished else { return }
        let wasHeld = phase == .held
        phase = .finished
        detachFromClient()
        call?.cancel()
        call = nil
        connectWatchdog = nil
        responseHeadTimer = nil
        retryTimer = nil
        // Only a request still queued for a connection has its wait timer (granting or timing out clears
        // it); the others need no O(waiters) search when a released burst finishes.
        if poolWaitTimer != nil { route.pool.cancelWait(for: self) }
        poolWaitTimer = nil
        returnConnection()
        holdTimer = nil
        if wasHeld { proxy.unhold(self) }
        recordHoldEnded()
        if let body { evbuffer_free(body) }
        body = nil
        proxy.exchangeFinished(self, status: answeredStatus, summary: AccessLogEntry(
            method: method, target: accessLogTarget, status: answeredStatus,
            seconds: EventLoop.monotonicNow - arrivedAt, attempts: sends, generation: sentGeneration))
        let retained = selfRetain
        selfRetain = nil
        retained?.release()
    }

    /// Used at shutdown when the drain deadline passes.
    func abandon() {
        guard phase != .finished else { return }
        if phase == .streaming {
            abortClient()
        } else {
            reply(.unavailable("tokenrelay is shutting down"))
        }
    }
}
