import HTTPTransport
import HTTPWire

/// A deliberately small reverse proxy on HTTPTransport, for bench/run.sh only: it injects a fixed
/// Authorization header and keeps a pool of upstream connections, and nothing else (no 401 handling, no
/// limits, no timeouts). It measures what the transport and the parser cost per request, next to nginx
/// and to tokenrelay itself; it is not a product and must not grow into one.
final class BenchRelay {
    let loop: TransportLoop
    let upstreamHost: String
    let upstreamPort: UInt16
    let authorization: String
    private var idle: [HTTPClientConnection] = []
    private var exchanges: [ObjectIdentifier: RelayExchange] = [:]

    init(loop: TransportLoop, upstreamHost: String, upstreamPort: UInt16, token: String) {
        self.loop = loop
        self.upstreamHost = upstreamHost
        self.upstreamPort = upstreamPort
        self.authorization = "Bearer \(token)"
    }

    func accepted(_ client: HTTPServerConnection) {
        let exchange = RelayExchange(relay: self, client: client)
        exchanges[ObjectIdentifier(client)] = exchange
        client.handler = exchange
    }

    func clientEnded(_ client: HTTPServerConnection) {
        exchanges[ObjectIdentifier(client)] = nil
    }

    func acquire() -> HTTPClientConnection? {
        while let connection = idle.popLast() {
            if connection.isReusable { return connection }
        }
        return try? HTTPClientConnection(loop: loop, host: upstreamHost, port: upstreamPort)
    }

    func release(_ connection: HTTPClientConnection) {
        if connection.isReusable {
            connection.handler = nil
            idle.append(connection)
        }
    }
}

/// One client connection's requests, relayed one at a time.
final class RelayExchange: HTTPServerConnectionHandler, HTTPClientConnectionHandler {
    private unowned let relay: BenchRelay
    // Strong: the client connection may end (and leave its server's table) inside a call that this
    // exchange makes on it, and the exchange still reads it afterwards. Sending after the end is a no-op.
    private let client: HTTPServerConnection
    private var upstream: HTTPClientConnection?
    private var responding = false

    init(relay: BenchRelay, client: HTTPServerConnection) {
        self.relay = relay
        self.client = client
    }

    // Client side

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        guard let upstream = relay.acquire() else {
            connection.respond(HTTPResponseHead(status: 502, reason: "Bad Gateway"), body: Array("no upstream\n".utf8))
            return
        }
        self.upstream = upstream
        upstream.handler = self
        var fields: [(name: String, value: String)] = [("Host", "\(relay.upstreamHost):\(relay.upstreamPort)"), ("Authorization", relay.authorization)]
        head.forEachField { name, value in
            let lower = String(decoding: name, as: UTF8.self).lowercased()
            switch lower {
            case "host", "authorization", "connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
                 "content-length", "transfer-encoding", "expect":
                return
            default:
                fields.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
            }
        }
        let body: BodyLength
        switch head.framing {
        case .none: body = .none
        case .length(let n): body = .known(n)
        case .chunked, .untilClose: body = .unknown
        }
        upstream.startRequest(method: head.methodName, target: Array(head.target), fields: fields, body: body)
    }

    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        upstream?.sendBody(bytes)
    }

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        upstream?.finishRequest()
    }

    func connectionCanSendMore(_ connection: HTTPServerConnection) {
        upstream?.resumeReading()
    }

    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        if let upstream {
            upstream.handler = nil
            upstream.close()
            self.upstream = nil
        }
        relay.clientEnded(connection)
    }

    // Upstream side

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}

    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        var fields: [(name: String, value: String)] = []
        head.forEachField { name, value in
            let lower = String(decoding: name, as: UTF8.self).lowercased()
            switch lower {
            case "connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "content-length", "transfer-encoding":
                return
            default:
                fields.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
            }
        }
        let body: BodyLength
        switch head.framing {
        case .none: body = .none
        case .length(let n): body = .known(n)
        case .chunked, .untilClose: body = .unknown
        }
        responding = true
        client.startResponse(HTTPResponseHead(status: head.status, reason: head.reason, fields: fields), body: body)
    }

    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        client.sendBody(bytes)
        if !client.canSendMore { connection.pauseReading() }
    }

    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        upstream = nil
        responding = false
        relay.release(connection)
        client.finishResponse()
    }

    func connectionCanSendMore(_ connection: HTTPClientConnection) {}

    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        guard upstream === connection else { return }
        upstream = nil
        if responding {
            client.close()   // truncated: the client must not take a partial body for a whole one
        } else {
            client.respond(HTTPResponseHead(status: 502, reason: "Bad Gateway"), body: Array("upstream failed\n".utf8))
        }
    }
}
