import CLibevent
import Glibc

/// Makes `evhttp_connection`s to one endpoint, plain or TLS, with the settings every outgoing connection
/// shares: the timeout and no retries by evhttp (a failed request is the caller's decision).
///
/// The upstream pool and the token-endpoint client both get their connections here, so there is one
/// place that knows how a TLS connection is put together.
final class HTTPConnectionFactory {
    private let loop: EventLoop
    let endpoint: HTTPEndpoint
    private let tls: TLSContext?
    private let timeoutSeconds: Double

    /// `tls` must be given exactly when the endpoint is https.
    init(loop: EventLoop, endpoint: HTTPEndpoint, tls: TLSContext?, timeoutSeconds: Double) {
        precondition(endpoint.usesTLS == (tls != nil), "an https endpoint needs a TLS context, and only it")
        self.loop = loop
        self.endpoint = endpoint
        self.tls = tls
        self.timeoutSeconds = timeoutSeconds
    }

    static let maximumResponseHeadBytes = 256 * 1024

    func makeConnection() -> OpaquePointer? {
        let connection: OpaquePointer?
        if let tls {
            connection = makeTLSConnection(tls)
        } else {
            connection = evhttp_connection_base_new(loop.base, loop.dns, endpoint.host, UInt16(endpoint.port))
        }
        guard let connection else { return nil }
        var tv = timeval(seconds: timeoutSeconds)
        evhttp_connection_set_timeout_tv(connection, &tv)
        evhttp_connection_set_retries(connection, 0)
        // A peer's response head is bounded like a client's request head (evhttp's default is unlimited:
        // a 100 MB header would be buffered whole); beyond it the request fails as "response too large".
        evhttp_connection_set_max_headers_size(connection, Self.maximumResponseHeadBytes)
        return connection
    }

    /// Whether the connection has an established TCP connection (a kept-alive one, or one whose connect
    /// finished). evhttp resets a connection to no socket after a failure or when it notices the peer
    /// closed an idle one; resolving and connecting have a socket without a peer.
    static func isConnected(_ connection: OpaquePointer) -> Bool {
        let fd = bufferevent_getfd(evhttp_connection_get_bufferevent(connection))
        guard fd >= 0 else { return false }
        var address = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        return withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) == 0 }
        }
    }

    /// The bufferevent starts in the connecting state with no socket; evhttp creates the socket, and on
    /// a reconnect libevent clears the same `SSL` and handshakes again (keeping SNI and the name to
    /// verify). Dirty shutdowns are allowed because many servers close without close_notify, and
    /// framing is HTTP's job. The bufferevent owns the `SSL`, the connection owns the bufferevent.
    private func makeTLSConnection(_ tls: TLSContext) -> OpaquePointer? {
        guard let ssl = tls.makeSSL() else { return nil }
        let options = Int32(BEV_OPT_CLOSE_ON_FREE.rawValue | BEV_OPT_DEFER_CALLBACKS.rawValue)
        guard let bev = bufferevent_openssl_socket_new(loop.base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, options) else {
            SSL_free(ssl)
            return nil
        }
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1)
        guard let connection = evhttp_connection_base_bufferevent_new(loop.base, loop.dns, bev, endpoint.host, UInt16(endpoint.port)) else {
            bufferevent_free(bev)
            return nil
        }
        return connection
    }
}
