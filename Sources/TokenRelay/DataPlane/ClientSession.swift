import HTTPTransport
import HTTPWire

/// One client connection on the transport front end. Turns each request into a `RelayedExchange`; the
/// transport parses the next request of a keep-alive or pipelined connection only after the current
/// response is finished, so at most one exchange is current.
///
/// A body up to `limits.max_body_bytes` is collected whole before the exchange begins (it is kept for a
/// replay). A larger one is streamed: a `Content-Length` over the limit begins the exchange at the head,
/// a chunked body when it grows past the limit (what was collected goes first).
final class ClientSession: HTTPServerConnectionHandler, ExchangeSession {
    private unowned let proxy: ProxyServer
    private unowned let frontEnd: TransportFrontEnd
    let connection: HTTPServerConnection
    var client: HTTPServerConnection { connection }
    private var head: ReceivedRequestHead?
    private var body: [UInt8] = []
    /// The current request's body is streamed: its pieces and its end go to the exchange (if it is
    /// still running; after its answer they are dropped, and the connection closes after that answer).
    private var streaming = false
    private var exchange: RelayedExchange<ClientSession>?
    /// Deadline timers for this connection's exchanges, kept between them (see `DeadlineTimer`): the top
    /// of a stack linked through the timers themselves (an array would check its uniqueness and capacity
    /// at every push and pop, twice per request).
    private var spareDeadlineTimer: DeadlineTimer?
    /// The storage of the last exchange's upstream target, kept empty for the next one: a keep-alive
    /// client then costs one allocation for its targets, not an allocation and a free per request.
    private var spareTargetBuffer: [UInt8] = []
    /// The client's address for the forwarding headers, made with the connection's first forwarded request.
    private(set) lazy var forwardedClient = ForwardedClient(address: connection.peer.host)

    /// The route whose own listener accepted the connection: all its requests are that route's (nil: the
    /// main listener, where each request's head picks its route).
    let listenerRoute: String?

    init(proxy: ProxyServer, frontEnd: TransportFrontEnd, connection: HTTPServerConnection, listenerRoute: String? = nil) {
        self.listenerRoute = listenerRoute
        self.proxy = proxy
        self.frontEnd = frontEnd
        self.connection = connection
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: consuming ReceivedRequestHead) {
        let framing = head.framing
        var incoming: ReceivedRequestHead? = consume head   // moved in, not copied
        swap(&self.head, &incoming)
        body = []
        streaming = false
        if case .length(let length) = framing, length > proxy.context.maxBodyBytes {
            // The client's `Expect: 100-continue` is answered when the body can flow to the upstream.
            return beginStreaming(length: .known(length), prefix: [])
        }
        // The body is kept whole for a replay, so it is wanted at once: the client may send it.
        if connection.awaitsContinue { connection.sendContinue() }
    }

    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        if streaming {
            exchange?.streamedBodyReceived(bytes)
            return
        }
        guard head != nil else { return }
        if body.count + bytes.count > proxy.context.maxBodyBytes {
            // A chunked body that outgrew what is kept: streamed from here, the collected part first.
            var prefix = body
            prefix.append(contentsOf: bytes)
            body = []
            return beginStreaming(length: .unknown, prefix: prefix)
        }
        // Grown moved out of the session and back (as `ProxyServer.changeActive` explains): the accesses to
        // `body` on every request are then ones the compiler proves exclusive, not checked at run time.
        var collected: [UInt8] = []
        swap(&collected, &body)
        collected.append(contentsOf: bytes)
        swap(&collected, &body)
    }

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        if streaming {
            exchange?.streamedBodyEnded()
            return
        }
        // Taken, not copied: the head's arrays move into the exchange without a retain and release each.
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
                                              body: .streamed(StreamedRequestBody(client: connection, length: length, prefix: prefix)))
        self.exchange = exchange
        exchange.begin()
    }

    func connectionSentHTTP2Preface(_ connection: HTTPServerConnection) {
        frontEnd.startHTTP2(connection, listenerRoute: listenerRoute)
    }

    func connectionCanSendMore(_ connection: HTTPServerConnection) {
        exchange?.clientCanSendMore()
    }

    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        if ended == .headTimeout { proxy.metrics.countClientConnectionLimit(action: "closed_slow_head") }
        let current = exchange
        exchange = nil
        current?.clientGone()
        frontEnd.sessionEnded(self)
    }

    func lendDeadlineTimer() -> DeadlineTimer {
        guard let timer = spareDeadlineTimer else { return DeadlineTimer(loop: proxy.loop.transport) }
        spareDeadlineTimer = timer.nextSpare
        timer.nextSpare = nil
        return timer
    }

    func returnDeadlineTimer(_ timer: DeadlineTimer) {
        timer.nextSpare = spareDeadlineTimer
        spareDeadlineTimer = timer
    }

    /// An empty buffer for an exchange's upstream target (the spare one if it is here; a second exchange
    /// of the connection running at once gets a new one).
    func lendTargetBuffer() -> [UInt8] {
        var buffer: [UInt8] = []
        swap(&buffer, &spareTargetBuffer)
        return buffer
    }

    /// Keeps `buffer`'s storage for the next exchange, leaving `buffer` empty. The exchange hands it over
    /// moved out of itself (not a copy): emptying a buffer that has another holder would allocate a new one.
    func returnTargetBuffer(_ buffer: inout [UInt8]) {
        buffer.removeAll(keepingCapacity: true)
        swap(&buffer, &spareTargetBuffer)
    }

    func exchangeFinished(_ finished: RelayedExchange<ClientSession>) {
        if exchange === finished { exchange = nil }
    }
}

/// The upstream connection of the current exchange reports here, and the session passes each report on
/// to that exchange. The connection holds its handler (this session) strongly, and lets go when the
/// connection ends or the handler is cleared: an exchange clears it (`handler = nil`) whenever it lets go
/// of the connection (given back to the pool, closed, or handed to a tunnel), so an idle pooled connection
/// keeps no session alive. Only the current exchange ever has an upstream connection that reports: an
/// exchange lets go of its connection before its response ends, and the next request is parsed only after
/// that.
extension ClientSession: HTTPClientConnectionReportForwarding {
    var reportTarget: RelayedExchange<ClientSession>? { exchange }
}
