import HTTPTransport
import HTTPWire

/// One HTTP/2 client connection (h2c with prior knowledge) on the proxied port. Each request stream
/// becomes a `StreamSession` and its `RelayedExchange`, as an HTTP/1.1 request does: same request
/// machine, same header rules, limits and timeouts per stream as per request.
///
/// A gRPC request (`content-type: application/grpc…`, or `te: trailers`) needs HTTP/2 to the upstream:
/// to an HTTP/1.1 upstream (`upstream.http2` "never") it is answered at once with gRPC's UNAVAILABLE (14)
/// as a Trailers-Only response, never relayed half-way.
final class HTTP2ClientSession: HTTP2ServerConnectionHandler {
    private unowned let proxy: ProxyServer
    private unowned let frontEnd: TransportFrontEnd
    let connection: HTTP2ServerConnection
    private(set) lazy var forwardedClient = ForwardedClient(address: connection.peer.host)
    /// Deadline timers and target buffers of finished streams, for the next ones (as `ClientSession`
    /// keeps its exchanges'): a stream then costs no timer event and no buffer of its own.
    private var spareDeadlineTimer: DeadlineTimer?
    private var spareTargetBuffers: [[UInt8]] = []

    /// The route whose own listener accepted the connection (nil: the main listener).
    let listenerRoute: String?

    init(proxy: ProxyServer, frontEnd: TransportFrontEnd, connection: HTTP2ServerConnection, listenerRoute: String? = nil) {
        self.listenerRoute = listenerRoute
        self.proxy = proxy
        self.frontEnd = frontEnd
        self.connection = connection
    }

    func connection(_ connection: HTTP2ServerConnection, opened stream: HTTP2ServerStream) {
        guard let head = stream.head else { return }
        // gRPC needs HTTP/2 end to end: it is passed on only to an upstream that `upstream.http2` says speaks it.
        // A call no route takes (no top-level upstream) goes on to its 404, which gRPC reads as UNIMPLEMENTED.
        let chosen = proxy.context(for: head, listenerRoute: listenerRoute).context
        if Self.isGRPC(head) && !chosen.answersNotFound && !chosen.route.acceptsGRPCCall() {
            proxy.refused("gRPC request to an HTTP/1.1 upstream")
            return Self.answerUnavailable(stream, message: "tokenrelay: the upstream is reached over HTTP/1.1, gRPC needs HTTP/2")
        }
        let session = StreamSession(proxy: proxy, owner: self, stream: stream)
        stream.handler = session
        session.received(head)
    }

    func connectionEnded(_ connection: HTTP2ServerConnection) {
        spareDeadlineTimer = nil
        frontEnd.http2SessionEnded(self)
    }

    func lendDeadlineTimer() -> DeadlineTimer {
        guard let timer = spareDeadlineTimer else { return DeadlineTimer(loop: proxy.loop.transport) }
        spareDeadlineTimer = timer.nextSpare
        timer.nextSpare = nil
        return timer
    }

    func returnDeadlineTimer(_ timer: DeadlineTimer) {
        guard !connection.isClosed else { return }
        timer.nextSpare = spareDeadlineTimer
        spareDeadlineTimer = timer
    }

    func lendTargetBuffer() -> [UInt8] { spareTargetBuffers.popLast() ?? [] }

    func returnTargetBuffer(_ buffer: inout [UInt8]) {
        guard spareTargetBuffers.count < connection.settings.maxConcurrentStreams else { return }
        var kept: [UInt8] = []
        swap(&kept, &buffer)
        kept.removeAll(keepingCapacity: true)
        spareTargetBuffers.append(kept)
    }

    /// RFC 9113 has no other way to tell a gRPC call; gRPC's own clients send both.
    static func isGRPC(_ head: ReceivedRequestHead) -> Bool {
        if let type = head.field("content-type")?.lowercased(), type.hasPrefix("application/grpc") { return true }
        if let te = head.field("te")?.lowercased(), te.split(separator: ",").contains(where: { $0.trimmingWhitespace() == "trailers" }) { return true }
        return false
    }

    /// gRPC's Trailers-Only answer: one HEADERS frame with `:status 200` and UNAVAILABLE.
    static func answerUnavailable(_ stream: HTTP2ServerStream, message: String) {
        GRPCLocalAnswer.send(to: stream, grpcStatus: 14, message: message)
    }
}

/// One request stream of an HTTP/2 client connection: collects its body as `ClientSession` does (kept
/// up to `limits.max_body_bytes` for a replay, streamed beyond it) and hands the request to a
/// `RelayedExchange`; the stream's reports and the upstream connection's go to that exchange.
final class StreamSession: HTTP2ServerStreamHandler, ExchangeSession {
    private unowned let proxy: ProxyServer
    private let owner: HTTP2ClientSession
    let stream: HTTP2ServerStream
    var client: HTTP2ServerStream { stream }
    var forwardedClient: ForwardedClient { owner.forwardedClient }
    var listenerRoute: String? { owner.listenerRoute }
    private var head: ReceivedRequestHead?
    private var body: [UInt8] = []
    private var streaming = false
    private var exchange: RelayedExchange<StreamSession>?

    init(proxy: ProxyServer, owner: HTTP2ClientSession, stream: HTTP2ServerStream) {
        self.proxy = proxy
        self.owner = owner
        self.stream = stream
    }

    func received(_ head: ReceivedRequestHead) {
        self.head = head
        if case .length(let length) = head.framing, length > proxy.context.maxBodyBytes {
            return beginStreaming(length: .known(length), prefix: [])
        }
        if head.expectsContinue { stream.sendContinue() }
    }

    func stream(_ stream: HTTP2ServerStream, receivedBody bytes: UnsafeRawBufferPointer) {
        if streaming {
            exchange?.streamedBodyReceived(bytes)
            return
        }
        guard head != nil else { return }
        if body.count + bytes.count > proxy.context.maxBodyBytes {
            var prefix = body
            prefix.append(contentsOf: bytes)
            body = []
            return beginStreaming(length: .unknown, prefix: prefix)
        }
        body.append(contentsOf: bytes)
    }

    func streamReceivedEnd(_ stream: HTTP2ServerStream) {
        if streaming {
            exchange?.streamedBodyEnded()
            return
        }
        guard let head = head.take() else { return }
        let exchange = RelayedExchange.routed(by: proxy, session: self, head: head, body: .kept(body))
        body = []
        self.exchange = exchange
        exchange.begin()
    }

    private func beginStreaming(length: BodyLength, prefix: [UInt8]) {
        guard let head = head.take() else { return }
        streaming = true
        let exchange = RelayedExchange.routed(by: proxy, session: self, head: head,
                                              body: .streamed(StreamedRequestBody(client: stream, length: length, prefix: prefix)))
        self.exchange = exchange
        exchange.begin()
    }

    func streamCanSendMore(_ stream: HTTP2ServerStream) {
        exchange?.clientCanSendMore()
    }

    /// RST_STREAM from the client (or its connection closed) before the answer was complete: its
    /// upstream request is cancelled, as for an HTTP/1.1 client that left.
    func streamReset(_ stream: HTTP2ServerStream) {
        let current = exchange
        exchange = nil
        current?.clientGone()
    }

    func lendDeadlineTimer() -> DeadlineTimer { owner.lendDeadlineTimer() }

    func returnDeadlineTimer(_ timer: DeadlineTimer) { owner.returnDeadlineTimer(timer) }

    func lendTargetBuffer() -> [UInt8] { owner.lendTargetBuffer() }

    func returnTargetBuffer(_ buffer: inout [UInt8]) { owner.returnTargetBuffer(&buffer) }

    func exchangeFinished(_ finished: RelayedExchange<StreamSession>) {
        if exchange === finished { exchange = nil }
    }
}

/// The upstream connection of the stream's exchange reports here (see `ClientSession`'s forwarding).
extension StreamSession: HTTPClientConnectionReportForwarding {
    var reportTarget: RelayedExchange<StreamSession>? { exchange }
}
