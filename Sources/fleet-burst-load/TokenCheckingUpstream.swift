import HTTPTransport

/// The API behind the relays: 200 `ok` for any bearer token not declared dead, 401 otherwise. The script
/// kills a token with `GET /__kill?token=T` (answered 204), the way its own upstream's token dies at expiry;
/// the relay's new token is then accepted without the script having to tell this process about it.
final class TokenCheckingUpstream {
    private var dead: Set<String> = []
    private var exchanges: [ObjectIdentifier: UpstreamExchange] = [:]

    func accepted(_ connection: HTTPServerConnection) {
        let exchange = UpstreamExchange(upstream: self)
        exchanges[ObjectIdentifier(connection)] = exchange
        connection.handler = exchange
    }

    func ended(_ connection: HTTPServerConnection) {
        exchanges[ObjectIdentifier(connection)] = nil
    }

    /// The status for one request head (a kill is applied here).
    func answer(_ head: ReceivedRequestHead) -> Int {
        let target = String(decoding: head.target, as: UTF8.self)
        if target.hasPrefix("/__kill?token=") {
            dead.insert(String(target.dropFirst("/__kill?token=".count)))
            return 204
        }
        guard let authorization = head.field("authorization"), authorization.hasPrefix("Bearer ") else { return 401 }
        return dead.contains(String(authorization.dropFirst("Bearer ".count))) ? 401 : 200
    }
}

/// One connection's requests, answered once each request has been read completely.
final class UpstreamExchange: HTTPServerConnectionHandler {
    private unowned let upstream: TokenCheckingUpstream
    private var status = 200

    init(upstream: TokenCheckingUpstream) {
        self.upstream = upstream
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        status = upstream.answer(head)
    }

    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {}

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        switch status {
        case 200: connection.respond(HTTPResponseHead(status: 200, reason: "OK"), body: Array("ok".utf8))
        case 204: connection.respond(HTTPResponseHead(status: 204, reason: "No Content"), body: [])
        default: connection.respond(HTTPResponseHead(status: 401, reason: "Unauthorized"), body: [])
        }
    }

    func connectionCanSendMore(_ connection: HTTPServerConnection) {}

    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        upstream.ended(connection)
    }
}
