import Foundation

/// Which headers cross the proxy, in each direction (RFC 9110 §7.6.1).
enum HeaderPolicy {
    /// Hop-by-hop headers: they describe one connection, never the end-to-end message.
    static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "proxy-authenticate", "proxy-authorization",
    ]

    /// Request headers tokenrelay always sets itself: framing is redone, `Host` names the upstream,
    /// credentials are injected (a client's own `Authorization` must never reach the upstream), and
    /// `Expect` would make evhttp's client side wait for a 100 that may never come.
    static let replacedOnRequest: Set<String> = ["host", "content-length", "authorization", "expect"]

    /// Names listed in `Connection` are hop-by-hop for this message too.
    static func connectionListed(_ headers: [(name: String, value: String)]) -> Set<String> {
        var names: Set<String> = []
        for header in headers where header.name.lowercased() == "connection" {
            for token in header.value.split(separator: ",") {
                names.insert(token.trimmingCharacters(in: .whitespaces).lowercased())
            }
        }
        return names
    }

    /// - Parameter keepAuthorization: only for passthrough paths, where tokenrelay injects nothing.
    static func forwardedRequestHeaders(_ headers: [(name: String, value: String)], keepAuthorization: Bool = false)
        -> [(name: String, value: String)] {
        let listed = connectionListed(headers)
        return headers.filter { header in
            let name = header.name.lowercased()
            if keepAuthorization && name == "authorization" { return true }
            return !hopByHop.contains(name) && !replacedOnRequest.contains(name) && !listed.contains(name)
        }
    }

    /// Response headers passed to the client. `Content-Length` stays (evhttp then frames by it);
    /// `Transfer-Encoding` goes, since evhttp has already de-chunked the body and re-chunks as needed.
    static func forwardedResponseHeaders(_ headers: [(name: String, value: String)]) -> [(name: String, value: String)] {
        let listed = connectionListed(headers)
        return headers.filter { header in
            let name = header.name.lowercased()
            return !hopByHop.contains(name) && !listed.contains(name)
        }
    }
}
