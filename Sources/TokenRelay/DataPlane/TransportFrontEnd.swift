import HTTPTransport
import HTTPWire

/// The proxied port on HTTPTransport (`data_plane: transport`): accepts client connections and gives
/// each a `ClientSession` with its first request head (`ClientSessionStarter` until then), which turns
/// its requests into `RelayedExchange`s.
final class TransportFrontEnd {
    private unowned let proxy: ProxyServer
    private let server: HTTPServer
    /// The listeners of routes with their own `listen`, by route name: bound at start (a name may need the
    /// system resolver, which blocks), so a reload that adds, moves or removes one waits for a restart.
    private(set) var routeServers: [String: HTTPServer] = [:]
    /// Connections that have sent a request head.
    private var sessions: [ObjectIdentifier: ClientSession] = [:]
    /// Connections that began with HTTP/2's preface. The starter stays their HTTP/1.1 handler (it is told
    /// when the socket closes), so they count as client connections like any other.
    private var http2Sessions: [ObjectIdentifier: HTTP2ClientSession] = [:]
    /// The handler of connections that have not sent a head yet.
    private lazy var starter = ClientSessionStarter(frontEnd: self, listenerRoute: nil)
    /// The starters of the routes' own listeners, which tell their sessions whose listener they came in on.
    private var routeStarters: [String: ClientSessionStarter] = [:]
    /// Client connections accepted and not ended, with or without a session.
    private(set) var openConnections = 0
    /// `limits.max_client_connections` for the whole process: the main listener and every route's own count
    /// against it together, with the main listener's rules at the limit applying across all of them.
    private let clientConnectionLimit = ConnectionLimitGroup()

    var port: UInt16 { server.port }
    /// The port a route's own listener is bound to (nil: none).
    func port(ofRoute name: String) -> UInt16? { routeServers[name]?.port }

    init(proxy: ProxyServer, config: Config) throws {
        self.proxy = proxy
        do {
            server = try HTTPServer(loop: proxy.loop.transport, host: config.listen.host, port: UInt16(clamping: config.listen.port),
                                    backlog: Int32(clamping: config.limits.listenBacklog), settings: Self.settings(config),
                                    limitGroup: clientConnectionLimit) { _ in }
        } catch {
            // One line for every listener: "cannot listen on 127.0.0.1:8080: Address already in use".
            throw HTTPListener.BindError(description: "cannot listen on \(error.description)")
        }
        server.onConnection = { [unowned self] connection in self.accepted(connection, listenerRoute: nil) }
        server.onLimitEvent = { [unowned self] event in self.limitReached(event) }
        // Same limits and timeouts as the main listener, the connections counted with the main listener's.
        for route in config.routes {
            guard let listen = route.listen else { continue }
            let routeServer: HTTPServer
            do {
                routeServer = try HTTPServer(loop: proxy.loop.transport, host: listen.host, port: UInt16(clamping: listen.port),
                                             backlog: Int32(clamping: config.limits.listenBacklog), settings: Self.settings(config),
                                             limitGroup: clientConnectionLimit) { _ in }
            } catch {
                throw HTTPListener.BindError(description: "cannot listen on \(error.description) (routes \(route.name))")
            }
            let name = route.name
            routeServer.onConnection = { [unowned self] connection in self.accepted(connection, listenerRoute: name) }
            routeServer.onLimitEvent = { [unowned self] event in self.limitReached(event) }
            routeServers[name] = routeServer
            routeStarters[name] = ClientSessionStarter(frontEnd: self, listenerRoute: name)
        }
    }

    /// The server's limits and timeouts from the config. Over the connection limit a request is answered
    /// with tokenrelay's own 503 (JSON, `Retry-After`).
    private static func settings(_ config: Config) -> HTTPServer.Settings {
        let overLimit = LocalResponse.tooManyConnections
        return HTTPServer.Settings(
            limits: HTTPWireLimits(maxHeadBytes: config.limits.maxHeaderBytes), maxConnections: config.limits.maxClientConnections,
            headTimeout: config.timeouts.clientHeaderSeconds, idleTimeout: config.timeouts.clientSeconds,
            bodyTimeout: config.timeouts.clientSeconds, sendTimeout: config.timeouts.clientSeconds,
            overLimitResponse: HTTPResponseHead(status: Int(overLimit.status), reason: overLimit.reason, fields: overLimit.headers),
            overLimitBody: Array(overLimit.body.utf8))
    }

    /// A reload: the connection limit applies at once, timeouts to new connections, the body limit to the
    /// next request.
    func apply(_ config: Config) {
        server.settings = Self.settings(config)
        for routeServer in routeServers.values { routeServer.settings = Self.settings(config) }
    }

    private func limitReached(_ event: HTTPServer.LimitEvent) {
        switch event {
        case .refused:
            proxy.metrics.countClientConnectionLimit(action: "refused")
            proxy.metrics.countRequest(status: Int(LocalResponse.tooManyConnections.status))
            proxy.answeredUnavailable(.tooManyConnections)
        case .closedIdle: proxy.metrics.countClientConnectionLimit(action: "closed_idle")
        case .closedStalledHead: break   // counted as closed_slow_head when the session hears the connection's end
        case .pausedAccepting: proxy.metrics.countClientConnectionLimit(action: "paused_accepting")
        case .acceptedOverLimit: break
        }
    }

    /// At exit the server closes its connections, which reports their end: the sessions must not be
    /// told (their exchanges would reach back into a proxy that is being freed).
    deinit {
        starter.frontEnd = nil
        for routeStarter in routeStarters.values { routeStarter.frontEnd = nil }
        for session in sessions.values { session.connection.handler = nil }
        for session in http2Sessions.values { session.connection.handler = nil }
    }

    /// HTTP/2 connections get a GOAWAY: their open streams finish, no new one starts.
    func stopAccepting() {
        server.stopAccepting()
        for routeServer in routeServers.values { routeServer.stopAccepting() }
        for session in http2Sessions.values { session.connection.drain() }
    }

    /// The connection's first bytes were HTTP/2's preface: its socket goes to an HTTP/2 connection with
    /// the limits of the running configuration.
    func startHTTP2(_ client: HTTPServerConnection, listenerRoute: String?) {
        guard let endpoint = client.takeOverForHTTP2() else { return }
        let config = proxy.config
        let settings = HTTP2ServerConnection.Settings(
            maxConcurrentStreams: config.limits.maxConcurrentStreams, maxHeadBytes: config.limits.maxHeaderBytes,
            idleTimeout: config.timeouts.clientSeconds, sendTimeout: config.timeouts.clientSeconds)
        let connection = HTTP2ServerConnection(loop: proxy.loop.transport, endpoint: endpoint, peer: client.peer, settings: settings)
        let http2 = HTTP2ClientSession(proxy: proxy, frontEnd: self, connection: connection, listenerRoute: listenerRoute)
        http2Sessions[ObjectIdentifier(http2)] = http2
        connection.handler = http2
        if proxy.isDraining { connection.drain() }
        connection.start()
    }

    func http2SessionEnded(_ session: HTTP2ClientSession) {
        http2Sessions[ObjectIdentifier(session)] = nil
        if proxy.isDraining { proxy.checkDrained() }
    }

    /// HTTP/2 connections not closed yet. At shutdown they close once their last stream's frames (and
    /// the GOAWAY) are written, which is after the exchanges have finished: their output is written once
    /// per loop iteration, so an exit as soon as the last exchange finished would lose it.
    var openHTTP2Connections: Int { http2Sessions.count }

    /// `listenerRoute`: the route whose own listener accepted it (nil: the main listener).
    private func accepted(_ connection: HTTPServerConnection, listenerRoute: String?) {
        // A client's FIN while its answer streams means it left: the upstream request is dropped. One that
        // comes after a whole request but before its answer is a half-close: the answer is still given.
        connection.halfCloseEndsTheConnection = true
        // h2c with prior knowledge is told from HTTP/1.1 by its first bytes, on the same port.
        connection.detectsHTTP2Preface = true
        connection.handler = listenerRoute.flatMap { routeStarters[$0] } ?? starter
        openConnections += 1
        proxy.metrics.clientConnections.record(Double(openConnections))
    }

    /// The connection's first request head has arrived: its session takes over as the handler.
    /// `listenerRoute`: the route whose own listener accepted it (nil: the main listener).
    func startSession(on connection: HTTPServerConnection, listenerRoute: String?) -> ClientSession {
        let session = ClientSession(proxy: proxy, frontEnd: self, connection: connection, listenerRoute: listenerRoute)
        sessions[ObjectIdentifier(session)] = session
        connection.handler = session
        return session
    }

    func sessionEnded(_ session: ClientSession) {
        sessions[ObjectIdentifier(session)] = nil
        connectionEnded()
    }

    func connectionEndedWithoutSession(_ ended: ConnectionEnd) {
        if ended == .headTimeout { proxy.metrics.countClientConnectionLimit(action: "closed_slow_head") }
        connectionEnded()
    }

    private func connectionEnded() {
        openConnections -= 1
        proxy.metrics.clientConnections.record(Double(openConnections))
    }
}
