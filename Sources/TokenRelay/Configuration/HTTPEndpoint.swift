import CLibevent

/// An `http://` or `https://` URL, split into what evhttp needs: host and port to connect to, the authority for
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

    /// `Host` header value: the port is omitted when it is the scheme's default.
    public var authority: String {
        let hostPart = host.contains(":") ? "[\(host)]" : host
        let defaultPort = scheme == "https" ? 443 : 80
        return port == defaultPort ? hostPart : "\(hostPart):\(port)"
    }

    /// Path and query as sent in the request line.
    public var requestTarget: String {
        let base = path.isEmpty ? "/" : path
        return query.map { "\(base)?\($0)" } ?? base
    }

    static func parse(_ text: String, field: String) throws -> HTTPEndpoint {
        // evhttp's own URI parser, so the proxy and its configuration agree on what a URL means.
        guard let uri = evhttp_uri_parse(text) else { throw ConfigError(field, "is not a valid URL") }
        defer { evhttp_uri_free(uri) }
        let scheme = evhttp_uri_get_scheme(uri).map { String(cString: $0).lowercased() } ?? ""
        guard scheme == "http" || scheme == "https" else {
            throw ConfigError(field, "must be an http:// or https:// URL")
        }
        guard let hostPointer = evhttp_uri_get_host(uri), hostPointer.pointee != 0 else {
            throw ConfigError(field, "must name a host")
        }
        if evhttp_uri_get_userinfo(uri) != nil { throw ConfigError(field, "must not contain user:password@") }
        if evhttp_uri_get_fragment(uri) != nil { throw ConfigError(field, "must not contain a #fragment") }
        let port = Int(evhttp_uri_get_port(uri))
        let path = evhttp_uri_get_path(uri).map { String(cString: $0) } ?? ""
        return HTTPEndpoint(
            scheme: scheme,
            host: String(cString: hostPointer),
            port: port > 0 ? port : (scheme == "https" ? 443 : 80),
            path: path,
            query: evhttp_uri_get_query(uri).map { String(cString: $0) }
        )
    }
}
