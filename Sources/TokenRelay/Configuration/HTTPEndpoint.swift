import HTTPTransport

/// An `http://` or `https://` URL, split into what a connection needs: host and port to connect to, the authority for
/// the `Host` header, and the path that prefixes every forwarded request.
public struct HTTPEndpoint: Sendable, CustomStringConvertible {
    public var scheme: String
    public var host: String
    public var port: Int
    public var path: String
    public var query: String?

    public var description: String { "\(scheme)://\(authority)\(path)" }

    /// Whether connections to this endpoint speak TLS.
    public var usesTLS: Bool { scheme == "https" }

    /// `Host` header value: the port is omitted when it is the scheme's default. An IPv6 host keeps the brackets
    /// the URL parser leaves on it (bracketing it again sent `Host: [[::1]]:8080`, and a DPoP `htu` with it).
    public var authority: String {
        let hostPart = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        let defaultPort = scheme == "https" ? 443 : 80
        return port == defaultPort ? hostPart : "\(hostPart):\(port)"
    }

    /// Path and query as sent in the request line.
    public var requestTarget: String {
        let base = path.isEmpty ? "/" : path
        return query.map { "\(base)?\($0)" } ?? base
    }

    static func parse(_ text: String, field: String) throws -> HTTPEndpoint {
        // The transport's URI parser, so the proxy and its configuration agree on what a URL means.
        guard let uri = URIComponents(parsing: text) else { throw ConfigError(field, "is not a valid URL") }
        let scheme = uri.scheme?.lowercased() ?? ""
        guard scheme == "http" || scheme == "https" else {
            throw ConfigError(field, "must be an http:// or https:// URL")
        }
        guard let host = uri.host, !host.isEmpty else {
            throw ConfigError(field, "must name a host")
        }
        if uri.userinfo != nil { throw ConfigError(field, "must not contain user:password@") }
        if uri.fragment != nil { throw ConfigError(field, "must not contain a #fragment") }
        let port = uri.port ?? 0
        return HTTPEndpoint(
            scheme: scheme,
            // RFC 3986 §6.2.2.1: case-insensitive, normalised to lower case, as the `Host` field and a DPoP `htu`
            // go out (a server comparing `htu` with its URL as written refused a mixed-case one).
            host: host.lowercased(),
            port: port > 0 ? port : (scheme == "https" ? 443 : 80),
            path: uri.path,
            query: uri.query
        )
    }
}
