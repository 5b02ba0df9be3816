import HTTPTransport
import HTTPWire

/// An HTTP server for small requests read whole (head and a bounded body): the admin listener and the
/// demo's API and token server. It runs on the transport, like the proxied port.
///
/// Each request is handed over once complete, with a `SmallResponder` that may answer now or later (a
/// forced refresh answers when the refresh is done). The connection reads nothing more until the answer
/// is sent, so answers go out in request order, and a responder answers its own request or nothing: one
/// whose client left, or that already answered, is a no-op and can never answer a later request.
final class SmallHTTPServer {
    struct Limits {
        var maxHeadBytes: Int
        var maxBodyBytes: Int
        /// How long a head, a body pause, or a keep-alive wait may take.
        var timeoutSeconds: Double
        /// Open connections (0: no limit). Over it, idle ones are closed to make room and a request with
        /// no slot gets 503: a flood of connections to this port must not take the descriptors the
        /// proxied port needs.
        var maxConnections = 0
        /// At the limit, connections that say nothing (silent, or trickling a head) are closed at once for
        /// a newcomer, even at the hard bound (see `HTTPServer.Settings.evictsQuietAtOnce`).
        var evictsQuietAtOnce = false
    }

    private let server: HTTPServer
    private let handler: (SmallRequest, SmallResponder) -> Void
    private let maxBodyBytes: Int
    private var sessions: [ObjectIdentifier: SmallHTTPSession] = [:]

    var boundPort: Int { Int(server.port) }
    /// Told of every action at the connection limit (loop thread).
    var onLimitEvent: ((HTTPServer.LimitEvent) -> Void)? {
        get { server.onLimitEvent }
        set { server.onLimitEvent = newValue }
    }

    /// Binds without SO_REUSEPORT, so a second tokenrelay on the same address fails at start instead of
    /// sharing the port. Throws `HTTPListener.BindError` ("cannot listen on HOST:PORT: reason").
    init(loop: EventLoop, host: String, port: Int, limits: Limits, handler: @escaping (SmallRequest, SmallResponder) -> Void) throws {
        self.handler = handler
        maxBodyBytes = limits.maxBodyBytes
        var settings = HTTPServer.Settings(limits: HTTPWireLimits(maxHeadBytes: limits.maxHeadBytes), maxConnections: limits.maxConnections,
                                           headTimeout: limits.timeoutSeconds, idleTimeout: limits.timeoutSeconds,
                                           bodyTimeout: limits.timeoutSeconds, sendTimeout: limits.timeoutSeconds,
                                           maxBodyBytes: limits.maxBodyBytes,
                                           inputCapacity: max(limits.maxHeadBytes, 4096) + limits.maxBodyBytes)
        settings.evictsQuietAtOnce = limits.evictsQuietAtOnce
        do {
            server = try HTTPServer(loop: loop.transport, host: host, port: UInt16(clamping: port), settings: settings) { _ in }
        } catch {
            throw HTTPListener.BindError(description: "cannot listen on \(error.description)")
        }
        server.onConnection = { [unowned self] connection in self.accepted(connection) }
    }

    /// At exit the server closes its connections, which reports their end: the sessions must not reach
    /// back into a server that is being freed.
    deinit {
        for session in sessions.values { session.connection.handler = nil }
        server.close()
    }

    private func accepted(_ connection: HTTPServerConnection) {
        let session = SmallHTTPSession(connection: connection, maxBodyBytes: maxBodyBytes) { [unowned self] request, responder in
            self.handler(request, responder)
        }
        session.onEnded = { [unowned self] session in self.sessions[ObjectIdentifier(session)] = nil }
        sessions[ObjectIdentifier(session)] = session
        connection.handler = session
    }
}

/// A complete request as the small server hands it over.
struct SmallRequest {
    let head: ReceivedRequestHead
    let body: [UInt8]

    var method: HTTPMethod { head.method }
    /// The request target as sent.
    var target: String { String(decoding: head.target, as: UTF8.self) }
    /// The target without its query.
    var path: String { String(target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? "") }

    func field(_ name: String) -> String? { head.field(name) }
}

/// Answers one request, once (see `SmallHTTPServer`).
struct SmallResponder {
    fileprivate weak var session: SmallHTTPSession?
    fileprivate let request: UInt64

    /// `Content-Length` and the connection's framing are added by the transport.
    func respond(status: Int, reason: String, fields: [(name: String, value: String)], body: [UInt8]) {
        session?.respond(to: request, HTTPResponseHead(status: status, reason: reason, fields: fields), body: body)
    }
}

/// One client connection of a `SmallHTTPServer`: collects each request's body, then hands it over.
final class SmallHTTPSession: HTTPServerConnectionHandler {
    let connection: HTTPServerConnection
    var onEnded: ((SmallHTTPSession) -> Void)?
    private let maxBodyBytes: Int
    private let deliver: (SmallRequest, SmallResponder) -> Void
    private var head: ReceivedRequestHead?
    private var body: [UInt8] = []
    /// The request being read or awaiting its answer, and whether it has one.
    private var requestNumber: UInt64 = 0
    private var answered = true

    init(connection: HTTPServerConnection, maxBodyBytes: Int,
         deliver: @escaping (SmallRequest, SmallResponder) -> Void) {
        self.connection = connection
        self.maxBodyBytes = maxBodyBytes
        self.deliver = deliver
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        requestNumber += 1
        answered = false
        self.head = head
        body = []
        // The transport has already answered 413 to a Content-Length over the limit; what is left may come.
        if connection.awaitsContinue { connection.sendContinue() }
    }

    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        // The transport's hard cap ends a chunked body that grows past the limit; this is the same bound.
        guard body.count + bytes.count <= maxBodyBytes else { return }
        body.append(contentsOf: bytes)
    }

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        guard let head else { return }
        self.head = nil
        let request = SmallRequest(head: head, body: body)
        body = []
        deliver(request, SmallResponder(session: self, request: requestNumber))
    }

    func connectionCanSendMore(_ connection: HTTPServerConnection) {}

    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        answered = true
        onEnded?(self)
    }

    fileprivate func respond(to request: UInt64, _ response: HTTPResponseHead, body: [UInt8]) {
        guard request == requestNumber, !answered else { return }
        answered = true
        connection.respond(response, body: body)
    }
}
