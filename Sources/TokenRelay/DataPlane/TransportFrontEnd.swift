import HTTPTransport
import HTTPWire

/// The proxied port on HTTPTransport (`data_plane: transport`): accepts client connections and gives
/// each a `ClientSession`, which turns its requests into `RelayedExchange`s.
final class TransportFrontEnd {
    private unowned let proxy: ProxyServer
    private let server: HTTPServer
    private var sessions: [ObjectIdentifier: ClientSession] = [:]
    private(set) var maxBodyBytes: Int

    var port: UInt16 { server.port }
    var openConnections: Int { sessions.count }

    init(proxy: ProxyServer, config: Config) throws {
        self.proxy = proxy
        maxBodyBytes = config.limits.maxBodyBytes
        do {
            server = try HTTPServer(loop: proxy.loop.transport, host: config.listen.host, port: UInt16(clamping: config.listen.port),
                                    backlog: Int32(clamping: config.limits.listenBacklog),
                                    limits: HTTPWireLimits(maxHeadBytes: config.limits.maxHeaderBytes),
                                    headTimeout: config.timeouts.clientHeaderSeconds) { _ in }
        } catch {
            throw ConfigError("listen", "cannot listen on \(config.listen): \(error.description)")
        }
        server.onConnection = { [unowned self] connection in self.accepted(connection) }
    }

    /// A reload: limits that apply per request take effect for the next one.
    func apply(_ config: Config) {
        maxBodyBytes = config.limits.maxBodyBytes
    }

    func stopAccepting() {
        server.stopAccepting()
    }

    private func accepted(_ connection: HTTPServerConnection) {
        let session = ClientSession(proxy: proxy, frontEnd: self, connection: connection)
        sessions[ObjectIdentifier(session)] = session
        connection.handler = session
        proxy.metrics.clientConnections.record(Double(sessions.count))
    }

    func sessionEnded(_ session: ClientSession) {
        sessions[ObjectIdentifier(session)] = nil
        proxy.metrics.clientConnections.record(Double(sessions.count))
    }
}
