import CEventShim
import CLibevent

/// One client request on the evhttp listener: carries out `RequestLifecycle`'s decisions with evhttp.
///
/// The rules (when to send, hold, replay, retry, answer 502/503/504) are the machine's, in
/// `Lifecycle/RequestLifecycle.swift`; this class only turns evhttp's callbacks into the machine's events
/// and its actions into evhttp calls. The body is kept in our own `evbuffer` until the exchange ends,
/// because a replay needs it byte for byte.
///
/// Lifetime: the exchange retains itself in `begin()` and releases when the machine says `finish`, which
/// happens exactly once and first removes every libevent registration that points at it.
final class Exchange: OutgoingRequestDelegate, ProxiedExchange {
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
    private var forwardedHeaders: [(name: String, value: String)] = []
    private var body: OpaquePointer?

    private var lifecycle: RequestLifecycle
    private let queue = LifecycleActionQueue()
    private var finished: Bool { queue.isFinished }

    private let arrivedAt = EventLoop.monotonicNow
    private var sentAt = 0.0
    /// The client's request target, copied only when the access log is on (the request may be freed
    /// before the exchange finishes).
    private var accessLogTarget: String?
    private var call: OutgoingRequest?
    private var connection: OpaquePointer?
    private var waitingForConnection = false
    /// The response whose head is being reported, valid during `outgoingRequestReceivedHeaders` only.
    private var arrivingResponse: OpaquePointer?
    private var timers: [RequestLifecycle.Timer: LoopEvent] = [:]
    /// evhttp has one timeout for connect, send and read: the connect phase is bounded by a watchdog.
    private var connectWatchdog: ConnectWatchdog?
    private var retryTimer: LoopEvent?
    private var captured: CapturedResponse?
    /// Non-nil exactly while our close callback and EV_CLOSED watcher are registered on the client connection.
    private var hangUpWatcher: LoopEvent?
    private var upstreamReadingPaused = false
    private var selfRetain: Unmanaged<Exchange>?

    init(proxy: ProxyServer, request: OpaquePointer) {
        self.proxy = proxy
        route = proxy.route
        injection = proxy.config.inject
        clientRequest = request
        clientConnection = evhttp_request_get_connection(request)
        method = evhttp_request_get_command(request)
        isHTTP10 = tr_evhttp_request_minor(request) == 0
        let timeouts = proxy.config.timeouts
        lifecycle = RequestLifecycle(settings: .init(
            idempotent: RetryPolicy.isIdempotent(method), holdSeconds: timeouts.holdSeconds,
            poolWaitSeconds: timeouts.poolWaitSeconds, upstreamSeconds: timeouts.upstreamSeconds,
            connectSeconds: timeouts.connectSeconds))
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
        let passthrough = route.isPassthrough(target)
        forwardedHeaders = ForwardingHeaders.apply(
            to: HeaderPolicy.forwardedRequestHeaders(clientHeaders, keepAuthorization: passthrough, injectedHeader: injection.headerKey),
            clientAddress: clientAddress, settings: proxy.config.forwarding)
        // Take the body out of evhttp's request into a buffer we own for every attempt.
        let input = evhttp_request_get_input_buffer(clientRequest)
        if EvBuffer.length(input) > 0, let owned = evbuffer_new() {
            evbuffer_add_buffer(owned, input)
            body = owned
        }
        execute(lifecycle.start(admission: passthrough ? nil : proxy.coordinator.admit(), now: EventLoop.monotonicNow))
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
        execute(lifecycle.refuse(response, now: EventLoop.monotonicNow))
    }

    // MARK: - Carrying out the machine's actions

    private func execute(_ actions: [RequestLifecycle.Action]) {
        queue.run(actions) { perform($0) }
    }

    private func perform(_ action: RequestLifecycle.Action) {
        switch action {
        case .acquireConnection(let admittedEarlier): acquireConnection(admittedEarlier: admittedEarlier)
        case .cancelConnectionWait:
            waitingForConnection = false
            route.pool.cancelWait(for: self)
        case .acquireFreshConnection: retryOnFreshConnection()
        case .send(let credential): send(credential)
        case .cancelUpstream:
            call?.cancel()
            call = nil
        case .releaseConnection: returnConnection()
        case .schedule(let timer, let seconds): schedule(timer, after: seconds)
        case .cancel(.connect): connectWatchdog = nil
        case .cancel(let timer): timers[timer] = nil
        case .hold, .unhold, .consultRefreshRules, .countReplay, .upstreamFailed, .retrying:
            execute(proxy.carryOut(action, for: self, lifecycle: &lifecycle))
        case .captureResponse:
            if let arrivingResponse { captured = CapturedResponse(response: arrivingResponse) }
        case .relayResponse:
            if let arrivingResponse { startStreaming(arrivingResponse) }
        case .endRelayedResponse: endStreaming()
        case .respondCaptured: replyCaptured401()
        case .respond(let response): reply(response)
        case .abortClient(let flushFirst): abortClient(flushingFirst: flushFirst)
        case .finish(let summary): finish(summary)
        }
    }

    private func schedule(_ timer: RequestLifecycle.Timer, after seconds: Double) {
        if timer == .connect {
            guard let connection else { return }
            connectWatchdog = ConnectWatchdog(loop: proxy.loop, connection: connection, seconds: seconds) { [unowned self] in
                self.execute(self.lifecycle.timerFired(.connect, now: EventLoop.monotonicNow))
            }
            return
        }
        let event = LoopEvent(loop: proxy.loop) { [unowned self] _ in
            self.timers[timer] = nil
            self.execute(self.lifecycle.timerFired(timer, now: EventLoop.monotonicNow))
        }
        event.schedule(after: seconds)
        timers[timer] = event
    }

    // MARK: - Sending

    private func acquireConnection(admittedEarlier: Bool) {
        let acquisition = route.pool.acquire(for: self, admittedBefore: admittedEarlier) { [unowned self] connection in
            self.waitingForConnection = false
            self.connectionAcquired(connection)
        }
        switch acquisition {
        case .ready(let connection): connectionAcquired(connection)
        case .queued:
            waitingForConnection = true
            execute(lifecycle.connectionQueued())
        case .full: execute(lifecycle.connectionRefused(now: EventLoop.monotonicNow))
        }
    }

    /// The token is read now, not at arrival: a refresh may have finished while we waited.
    private func connectionAcquired(_ connection: OpaquePointer) {
        self.connection = connection
        let admission = lifecycle.passthrough ? nil : proxy.coordinator.admit()
        var willSend = true
        if let admission, case .send = admission {} else if admission != nil { willSend = false }
        let reused = willSend ? route.pool.willSend(on: connection) : false
        execute(lifecycle.connectionAcquired(reused: reused, admission: admission, now: EventLoop.monotonicNow))
    }

    private func send(_ credential: RequestLifecycle.Credential) {
        guard let connection else { return }
        sentAt = EventLoop.monotonicNow
        captured = nil
        let call = OutgoingRequest(delegate: self)
        self.call = call
        let started = call.start(on: connection, method: method, target: target) { request in
            let headers = HeaderList(raw: evhttp_request_get_output_headers(request))
            for header in forwardedHeaders { headers.add(header.name, header.value) }
            headers.add("Host", route.authority)
            if case .token(_, let authorization) = credential { headers.add(injection.header, authorization) }
            let length = EvBuffer.length(body)
            // evhttp adds Content-Length only for POST and PUT (docs/evhttp.md, content-length); framing is ours.
            if length > 0 || method == EVHTTP_REQ_POST || method == EVHTTP_REQ_PUT || method == EVHTTP_REQ_PATCH {
                headers.add("Content-Length", String(length))
            }
            // Referenced, not copied; never reference an empty buffer (docs/evhttp.md, empty-reference).
            if length > 0, let body { evbuffer_add_buffer_reference(evhttp_request_get_output_buffer(request), body) }
        }
        if !started {
            self.call = nil
            execute(lifecycle.upstreamFailed(.init(kind: .connect, responseStarted: false, description: "could not connect"),
                                             now: EventLoop.monotonicNow))
        }
    }

    // MARK: - Upstream response

    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer) {
        proxy.metrics.upstreamLatency.record(EventLoop.monotonicNow - sentAt)
        if let connection { route.pool.responseStarted(on: connection) }
        let expired = RefreshTrigger.indicatesExpiredToken(
            status: Int(evhttp_request_get_response_code(response)),
            challenges: HeaderList(raw: evhttp_request_get_input_headers(response)).values("WWW-Authenticate"),
            triggerStatuses: proxy.config.refresh.triggerStatuses)
        arrivingResponse = response
        execute(lifecycle.responseHead(status: Int(evhttp_request_get_response_code(response)), indicatesExpiredToken: expired))
        arrivingResponse = nil
    }

    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer) {
        let input = evhttp_request_get_input_buffer(response)!
        switch lifecycle.phase {
        case .capturing: captured?.append(from: input)
        case .relaying: relay(input)
        default: evbuffer_drain(input, EvBuffer.length(input))
        }
    }

    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>) {
        self.call = nil
        let now = EventLoop.monotonicNow
        switch result {
        case .success: execute(lifecycle.responseEnded(now: now))
        case .failure(let failure):
            execute(lifecycle.upstreamFailed(.init(kind: RequestLifecycle.UpstreamFailure.Kind(rawValue: failure.kind.rawValue) ?? .connectionLost,
                                                   responseStarted: failure.afterResponseStarted, description: "\(failure)"), now: now))
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
    /// than inside the connection's own callback.
    private func retryOnFreshConnection() {
        let timer = LoopEvent(loop: proxy.loop) { [unowned self] _ in
            self.retryTimer = nil
            guard let connection = self.connection else { return }
            self.connectionAcquired(connection)
        }
        timer.schedule(after: 0)
        retryTimer = timer
    }

    /// Called by the proxy for every held exchange when a refresh cycle ends.
    func refreshFinished(_ outcome: RefreshCoordinator.Outcome) {
        execute(lifecycle.refreshFinished(outcome, now: EventLoop.monotonicNow))
    }

    // MARK: - Streaming to the client

    private func startStreaming(_ response: OpaquePointer) {
        let status = evhttp_request_get_response_code(response)
        let upstreamHeaders = HeaderList(raw: evhttp_request_get_input_headers(response)).entries
        let output = HeaderList(raw: evhttp_request_get_output_headers(clientRequest))
        for header in HeaderPolicy.forwardedResponseHeaders(upstreamHeaders) { output.add(header.name, header.value) }
        prepareClientFraming(hasLength: upstreamHeaders.contains { HTTPSyntax.isField($0.name, "content-length") })
        let reason = evhttp_request_get_response_code_line(response).map { String(cString: $0) } ?? ""
        evhttp_send_reply_start(clientRequest, status, reason)
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
        prepareClientFraming(hasLength: true)
        detachFromClient()
        let buffer = evbuffer_new()!
        EvBuffer.append(buffer, body)
        proxy.willSendFinalResponse(clientRequest)
        evhttp_send_reply(clientRequest, status, reason, method == EVHTTP_REQ_HEAD ? nil : buffer)
        evbuffer_free(buffer)
    }

    // MARK: - Client going away

    /// EV_CLOSED on the client's socket: nobody is left to answer.
    private func clientHungUp() {
        guard !finished else { return }
        detachFromClient()
        let connection = clientConnection
        withExtendedLifetime(self) {
            execute(lifecycle.clientGone(now: EventLoop.monotonicNow))
            if let connection { evhttp_connection_free(connection) }  // also frees the request
        }
    }

    /// evhttp is freeing the client connection (hang-up noticed on a write, or a timeout); called by
    /// `ClientConnections`, which owns the connection's close callback.
    func clientConnectionClosed() {
        guard !finished else { return }
        hangUpWatcher = nil  // the connection is being freed: nothing left to unregister
        // A request evhttp detached from its failed connection is ours to free; one still attached is
        // freed by evhttp right after this callback.
        if evhttp_request_get_connection(clientRequest) == nil { evhttp_request_free(clientRequest) }
        execute(lifecycle.clientGone(now: EventLoop.monotonicNow))
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
    }

    /// Removes our registrations on the client connection; must precede anything that may free it, and
    /// must not touch the connection afterwards (it may be gone).
    private func detachFromClient() {
        guard hangUpWatcher != nil, let clientConnection else { return }
        hangUpWatcher = nil
        proxy.clientConnections.detach(from: clientConnection)
    }

    /// Frees everything the exchange still holds; the machine's last action, exactly once.
    private func finish(_ summary: RequestLifecycle.Summary) {
        detachFromClient()
        call?.cancel()
        call = nil
        connectWatchdog = nil
        timers.removeAll()
        retryTimer = nil
        // Only a request still queued for a connection needs the O(waiters) search.
        if waitingForConnection { route.pool.cancelWait(for: self) }
        waitingForConnection = false
        returnConnection()
        if let body { evbuffer_free(body) }
        body = nil
        let status = Int32(clamping: summary.status)
        proxy.exchangeFinished(self, status: status, summary: AccessLogEntry(
            method: AccessLogEntry.name(of: method), target: accessLogTarget, status: status,
            seconds: EventLoop.monotonicNow - arrivedAt, attempts: summary.attempts, generation: summary.generation), hold: summary.hold)
        let retained = selfRetain
        selfRetain = nil
        retained?.release()
    }

    /// Used at shutdown when the drain deadline passes.
    func abandon() {
        execute(lifecycle.abandon(now: EventLoop.monotonicNow))
    }
}
