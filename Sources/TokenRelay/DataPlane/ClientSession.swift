import HTTPTransport
import HTTPWire

/// One client connection on the transport front end. Turns each request into a `RelayedExchange`; the
/// transport parses the next request of a keep-alive or pipelined connection only after the current
/// response is finished, so at most one exchange is current.
///
/// A body up to `limits.max_body_bytes` is collected whole before the exchange begins (it is kept for a
/// replay). A larger one is streamed: a `Content-Length` over the limit begins the exchange at the head,
/// a chunked body when it grows past the limit (what was collected goes first).
final class ClientSession: HTTPServerConnectionHandler {
    private unowned let proxy: ProxyServer
    private unowned let frontEnd: TransportFrontEnd
    let connection: HTTPServerConnection
    private var head: ReceivedRequestHead?
    private var body: [UInt8] = []
    /// The current request's body is streamed: its pieces and its end go to the exchange (if it is
    /// still running; after its answer they are dropped, and the connection closes after that answer).
    private var streaming = false
    private var exchange: RelayedExchange?

    init(proxy: ProxyServer, frontEnd: TransportFrontEnd, connection: HTTPServerConnection) {
        self.proxy = proxy
        self.frontEnd = frontEnd
        self.connection = connection
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        self.head = head
        body = []
        streaming = false
        if case .length(let length) = head.framing, length > proxy.config.limits.maxBodyBytes {
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
        if body.count + bytes.count > proxy.config.limits.maxBodyBytes {
            // A chunked body that outgrew what is kept: streamed from here, the collected part first.
            var prefix = body
            prefix.append(contentsOf: bytes)
            body = []
            return beginStreaming(length: .unknown, prefix: prefix)
        }
        body.append(contentsOf: bytes)
    }

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        if streaming {
            exchange?.streamedBodyEnded()
            return
        }
        guard let head else { return }
        self.head = nil
        let exchange = RelayedExchange(proxy: proxy, session: self, head: head, body: .kept(body))
        body = []
        self.exchange = exchange
        exchange.begin()
    }

    private func beginStreaming(length: BodyLength, prefix: [UInt8]) {
        guard let head else { return }
        self.head = nil
        streaming = true
        let exchange = RelayedExchange(proxy: proxy, session: self, head: head,
                                       body: .streamed(StreamedRequestBody(client: connection, length: length, prefix: prefix)))
        self.exchange = exchange
        exchange.begin()
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

    func exchangeFinished(_ finished: RelayedExchange) {
        if exchange === finished { exchange = nil }
    }
}
