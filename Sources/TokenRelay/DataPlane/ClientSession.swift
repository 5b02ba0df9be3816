import HTTPTransport
import HTTPWire

/// One client connection on the transport front end. Collects each request's head and body, and hands the
/// complete request to a `RelayedExchange`; the transport parses the next request of a keep-alive or
/// pipelined connection only after the current response is finished, so at most one exchange is current.
final class ClientSession: HTTPServerConnectionHandler {
    private unowned let proxy: ProxyServer
    private unowned let frontEnd: TransportFrontEnd
    let connection: HTTPServerConnection
    private var head: ReceivedRequestHead?
    private var body: [UInt8] = []
    /// The request's body is over `limits.max_body_bytes`: it was answered 413, the rest is not kept.
    private var refusedBody = false
    private var exchange: RelayedExchange?

    init(proxy: ProxyServer, frontEnd: TransportFrontEnd, connection: HTTPServerConnection) {
        self.proxy = proxy
        self.frontEnd = frontEnd
        self.connection = connection
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        self.head = head
        body = []
        refusedBody = false
        if case .length(let length) = head.framing, length > frontEnd.maxBodyBytes { return refuseBody() }
        // The body is kept whole for a replay, so it is wanted at once: the client may send it.
        if connection.awaitsContinue { connection.sendContinue() }
    }

    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        guard !refusedBody else { return }
        if body.count + bytes.count > frontEnd.maxBodyBytes { return refuseBody() }
        body.append(contentsOf: bytes)
    }

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        guard let head, !refusedBody else { return }
        self.head = nil
        let exchange = RelayedExchange(proxy: proxy, session: self, head: head, body: body)
        body = []
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

    /// Over the body limit: answered at once, and the connection closes after the answer (the rest of the
    /// body is not read as a next request).
    private func refuseBody() {
        refusedBody = true
        body = []
        proxy.refused("request body over limits.max_body_bytes")
        connection.closeAfterResponse = true
        let response = LocalResponse.bodyTooLarge
        connection.respond(HTTPResponseHead(status: Int(response.status), reason: response.reason, fields: response.headers),
                           body: Array(response.body.utf8))
        proxy.metrics.countRequest(status: Int(response.status))
    }
}
