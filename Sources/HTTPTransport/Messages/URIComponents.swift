import CLibevent

/// A URI split into its parts by libevent's RFC 3986 parser (`evhttp_uri_parse`, strict mode): what the
/// configuration's URLs and an absolute-form request target are read with, so the two agree on what a
/// URL means.
///
/// Parts that are absent are nil; `path` is the empty string when the URI has none. An IPv6 host keeps
/// its brackets, as the parser returns it. Text containing a NUL byte is refused (the C parser would stop
/// there and read a different URI than the one given).
public struct URIComponents: Sendable, Equatable {
    public var scheme: String?
    public var userinfo: String?
    public var host: String?
    /// The port as written; nil when none was (`http://host/` or `http://host:/`).
    public var port: Int?
    public var path: String
    public var query: String?
    public var fragment: String?

    public init?(parsing text: String) {
        guard !text.utf8.contains(0), let uri = evhttp_uri_parse(text) else { return nil }
        defer { evhttp_uri_free(uri) }
        scheme = evhttp_uri_get_scheme(uri).map { String(cString: $0) }
        userinfo = evhttp_uri_get_userinfo(uri).map { String(cString: $0) }
        host = evhttp_uri_get_host(uri).map { String(cString: $0) }
        let rawPort = evhttp_uri_get_port(uri)
        port = rawPort >= 0 ? Int(rawPort) : nil
        path = evhttp_uri_get_path(uri).map { String(cString: $0) } ?? ""
        query = evhttp_uri_get_query(uri).map { String(cString: $0) }
        fragment = evhttp_uri_get_fragment(uri).map { String(cString: $0) }
    }
}
