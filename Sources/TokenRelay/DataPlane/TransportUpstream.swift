import Glibc
import HTTPTransport
import HTTPWire

/// How the transport engine reaches the upstream: its pool, and how a connection's end reads as a failure
/// of the request on it.
enum TransportUpstream {
    /// `offerHTTP2`: "alpn": h2 is offered beside http/1.1, so that a server that changed to h2 is noticed
    /// at the next connection (`HTTPClientConnection.serverSelectedHTTP2`). `budget`: the process's
    /// `limits.max_upstream_connections`, shared by every route's pools.
    static func makePool(config: Config, upstream: HTTPEndpoint, tls: TransportTLSClientContext?, loop: EventLoop,
                         offerHTTP2: Bool = false, budget: UpstreamConnectionBudget,
                         account: UpstreamBudgetAccount? = nil) -> HTTPTransport.UpstreamPool {
        let connections = config.limits.maxUpstreamConnections
        // A response head is bounded at 256 KiB, far above any real API's.
        let limits = HTTPWireLimits(maxHeadBytes: 256 * 1024)
        var settings = HTTPTransport.UpstreamPool.Settings(maxConnections: connections, maxIdle: connections, limits: limits,
                                                            maxWaiters: config.limits.maxUpstreamWaiters,
                                                            idleTimeout: config.timeouts.poolIdleSeconds)
        settings.tls = tls
        if offerHTTP2 && tls != nil { settings.alpn = ["h2", "http/1.1"] }
        return HTTPTransport.UpstreamPool(loop: loop.transport, host: upstream.host, port: UInt16(clamping: upstream.port),
                                          settings: settings, budget: budget, budgetAccount: account)
    }

    /// The HTTP/2 connections to an upstream that `upstream.http2` says speaks it: as many connections as
    /// `limits.max_upstream_connections` (from the same process-wide budget), each with up to 100 streams (fewer if the server says so).
    /// `http1Allowed`: "alpn": the server may select HTTP/1.1, after which the route uses its HTTP/1.1 pool.
    static func makeHTTP2Pool(config: Config, upstream: HTTPEndpoint, tls: TransportTLSClientContext?, loop: EventLoop,
                              http1Allowed: Bool, budget: UpstreamConnectionBudget,
                              account: UpstreamBudgetAccount? = nil) -> HTTP2UpstreamPool {
        var settings = HTTP2UpstreamPool.Settings(maxConnections: config.limits.maxUpstreamConnections,
                                                  maxWaiters: config.limits.maxUpstreamWaiters,
                                                  idleTimeout: config.timeouts.poolIdleSeconds)
        settings.tls = tls
        settings.connectTimeout = config.timeouts.connectSeconds
        settings.http1Allowed = http1Allowed
        return HTTP2UpstreamPool(loop: loop.transport, host: upstream.host, port: UInt16(clamping: upstream.port), settings: settings,
                                 budget: budget, budgetAccount: account)
    }

    /// The failure an upstream connection's end means for the request on it.
    static func failure(_ end: ConnectionEnd, responseStarted: Bool, connected: Bool) -> RequestLifecycle.UpstreamFailure {
        switch end {
        case .connectFailed(let reason) where reason.contains("TLS"):
            // A certificate we refused, or the upstream's alert: never retried (nothing would change).
            return .init(kind: .tls, responseStarted: false, description: "TLS failure: \(reason)")
        case .connectFailed(let reason):
            return .init(kind: .connect, responseStarted: false, description: "could not connect (\(reason))")
        case .failed(let code) where !connected:
            return .init(kind: .connect, responseStarted: false, description: "could not connect (\(String(cString: strerror(code))))")
        case .peerClosed where !connected:
            return .init(kind: .connect, responseStarted: false, description: "could not connect")
        case .protocolError(let error):
            return .init(kind: .invalidResponse, responseStarted: responseStarted, description: "invalid HTTP response: \(error.reason)")
        case .unsolicitedBytes:
            return .init(kind: .invalidResponse, responseStarted: responseStarted, description: "invalid HTTP response: bytes beyond the response")
        case .timedOut, .headTimeout, .idleTimeout:
            return .init(kind: .timeout, responseStarted: responseStarted, description: "timed out")
        case .failed, .peerClosed, .closedLocally, .refusedOverLimit, .bodyTooLarge:
            return .init(kind: .connectionLost, responseStarted: responseStarted,
                         description: responseStarted ? "connection lost mid-response" : "connection closed before a response")
        }
    }

}
