import HTTPTransport

/// Maps a client's request target onto the upstream, and refuses targets that name another origin.
///
/// tokenrelay attaches credentials to everything it forwards, so it must never act as an open proxy: an
/// absolute-form target (`GET http://host/path`, which the transport passes through verbatim) is reduced to
/// origin-form only when it names the configured upstream (same scheme, host and port) or tokenrelay's
/// own listen address; any other host is a 400, not a request sent with a token to where the config
/// says. Authority-form (CONNECT) and asterisk-form targets are refused elsewhere or here.
struct RequestTarget {
    let upstream: HTTPEndpoint
    /// tokenrelay's own listen host and bound port: a client configured to use it as an HTTP proxy names
    /// the proxy itself.
    let listenHost: String
    let listenPort: Int

    struct Refusal: Error, Equatable, CustomStringConvertible {
        let description: String
    }

    /// The raw target's bytes, checked before they become a String (which would silently replace bytes
    /// that are not UTF-8). RFC 9112 §3.2 allows no whitespace or control character in a request target:
    /// a lenient parser passes a bare CR through, and `GET /a\rAuthorization: …` would reach the upstream as is.
    static func checkBytes<Bytes: Collection>(_ bytes: Bytes) -> Refusal? where Bytes.Element == UInt8 {
        var ascii = true
        for byte in bytes {
            if byte <= 0x20 || byte == 0x7F {
                return Refusal(description: "the request target contains whitespace or a control character")
            }
            if byte >= 0x80 { ascii = false }
        }
        // ASCII is UTF-8: most targets need no decoding.
        if !ascii && String(validating: bytes, as: UTF8.self) == nil {
            return Refusal(description: "the request target is not valid UTF-8")
        }
        return nil
    }

    /// The target to send upstream (the upstream URL's path prefixed), or why the request is refused.
    func upstreamTarget(for rawURI: String) -> Result<String, Refusal> {
        var target = rawURI
        if !target.hasPrefix("/") {
            switch originForm(ofAbsolute: rawURI) {
            case .success(let path): target = path
            case .failure(let refusal): return .failure(refusal)
            }
        }
        // `/../../etc/passwd` would escape the upstream's base path on an upstream that normalises, and
        // `/x/../public/y` would get a token although it resolves under a passthrough prefix: whatever
        // decides on the path must see the path the upstream will use. Refused rather than rewritten.
        if Self.hasDotSegment(target) { return .failure(Self.dotSegmentRefusal) }
        var base = upstream.path
        while base.hasSuffix("/") { base.removeLast() }
        return .success(base + target)
    }

    /// Why an absolute-form target may not be forwarded (nil: it names the upstream or tokenrelay). For a
    /// route that strips its prefix, whose target is cut to origin-form before `upstreamTarget` sees it.
    func refusal(ofAbsolute rawURI: String) -> Refusal? {
        if case .failure(let refusal) = originForm(ofAbsolute: rawURI) { return refusal }
        return nil
    }

    private func originForm(ofAbsolute rawURI: String) -> Result<String, Refusal> {
        guard let uri = URIComponents(parsing: rawURI) else { return .failure(Refusal(description: "the request target is not valid")) }
        guard let scheme = uri.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = uri.host?.lowercased(), !host.isEmpty else {
            return .failure(Refusal(description: "the request target is not valid"))
        }
        if uri.userinfo != nil { return .failure(Refusal(description: "the request target must not carry user information")) }
        let explicitPort = uri.port ?? 0
        let port = explicitPort > 0 ? explicitPort : (scheme == "https" ? 443 : 80)
        guard namesUpstream(scheme: scheme, host: host, port: port) || namesProxy(scheme: scheme, host: host, port: port) else {
            return .failure(Refusal(description: "the request names a host tokenrelay does not forward to"))
        }
        var target = uri.path
        if target.isEmpty { target = "/" }
        guard target.hasPrefix("/") else { return .failure(Refusal(description: "the request target is not valid")) }
        if let query = uri.query { target += "?" + query }
        return .success(target)
    }

    static let dotSegmentRefusal = Refusal(description: "the request target contains a dot segment (. or ..)")

    /// A path segment that is `.` or `..`, also percent-encoded (`%2e`), before any query. Scanned as bytes:
    /// it runs on every request, and most paths have no dot at all.
    static func hasDotSegment(_ target: String) -> Bool {
        hasDotSegment(target.utf8)
    }

    static func hasDotSegment<Bytes: Sequence<UInt8>>(_ target: Bytes) -> Bool {
        var dots = 0
        var onlyDots = true
        var pendingPercent = 0   // bytes of a "%2e" seen so far
        for byte in target {
            if byte == UInt8(ascii: "?") || byte == UInt8(ascii: "#") { break }
            if byte == UInt8(ascii: "/") {
                if onlyDots && pendingPercent == 0 && (dots == 1 || dots == 2) { return true }
                dots = 0
                onlyDots = true
                pendingPercent = 0
                continue
            }
            guard onlyDots else { continue }
            switch (pendingPercent, byte) {
            case (0, UInt8(ascii: ".")): dots += 1
            case (0, UInt8(ascii: "%")): pendingPercent = 1
            case (1, UInt8(ascii: "2")): pendingPercent = 2
            case (2, UInt8(ascii: "e")), (2, UInt8(ascii: "E")):
                pendingPercent = 0
                dots += 1
            default: onlyDots = false
            }
        }
        return onlyDots && pendingPercent == 0 && (dots == 1 || dots == 2)
    }

    private func namesUpstream(scheme: String, host: String, port: Int) -> Bool {
        scheme == upstream.scheme && Self.sameHost(host, upstream.host) && port == upstream.port
    }

    private func namesProxy(scheme: String, host: String, port: Int) -> Bool {
        guard scheme == "http" && port == listenPort else { return false }
        return Self.sameHost(host, listenHost) || ["localhost", "127.0.0.1", "::1"].contains(Self.bare(host))
    }

    private static func sameHost(_ a: String, _ b: String) -> Bool { bare(a).lowercased() == bare(b).lowercased() }

    /// The URI parser keeps the brackets of an IPv6 literal; the config's host has none.
    private static func bare(_ host: String) -> String {
        host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
    }
}
