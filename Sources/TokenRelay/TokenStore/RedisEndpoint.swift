import HTTPTransport

/// Where Redis is and how to log in (from `tokens.redis`).
struct RedisEndpoint: Equatable, Sendable {
    enum Address: Equatable, Sendable {
        case tcp(host: String, port: Int)
        case unix(path: String)
    }

    var address: Address
    var database = 0
    var username: String?
    var password: String?
    /// `rediss://`: TLS over TCP, with `tls` (built from `tokens.redis.tls` in `Preflight`).
    var usesTLS = false
    var tls: RedisTLS?

    var description: String {
        switch address {
        case .tcp(let host, let port):
            let text = host.contains(":") ? "[\(host)]:\(port)/\(database)" : "\(host):\(port)/\(database)"
            return usesTLS ? "\(text) (TLS)" : text
        case .unix(let path): return "unix://\(path)"
        }
    }
}

/// The TLS client context of a `rediss://` endpoint, and the config field it was built from (named in a
/// failed handshake, so that a wrong CA points at the setting to fix).
struct RedisTLS: Equatable, Sendable {
    let context: TransportTLSClientContext
    let field: String

    static func == (lhs: RedisTLS, rhs: RedisTLS) -> Bool {
        lhs.context === rhs.context && lhs.field == rhs.field
    }
}
