import HTTPTransport

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
        for header in headers where HTTPSyntax.isField(header.name, "connection") {
            for token in header.value.split(separator: ",") {
                names.insert(HTTPSyntax.fieldKey(String(HTTPSyntax.trimmedOWS(token))))
            }
        }
        return names
    }

    /// - Parameters:
    ///   - keepAuthorization: only for passthrough paths, where tokenrelay injects nothing: the client's
    ///     `Authorization` and its field named `injectedHeader` are kept.
    ///   - injectedHeader: the lower-cased header tokenrelay puts the token into (`inject.header`). The client's fields
    ///     of that name are always dropped; its own `Authorization` is kept when the token goes elsewhere,
    ///     since it then carries the client's own credentials for the API, not the ones tokenrelay manages.
    static func forwardedRequestHeaders(_ headers: [(name: String, value: String)], keepAuthorization: Bool = false,
                                        injectedHeader: String = "authorization") -> [(name: String, value: String)] {
        let listed = connectionListed(headers)
        let injected = injectedHeader
        return headers.filter { header in
            let name = HTTPSyntax.fieldKey(header.name)
            if keepAuthorization && (name == "authorization" || name == injected) { return true }
            if name == injected { return false }
            let replaced = name == "authorization" ? injected == "authorization" : replacedOnRequest.contains(name)
            return !hopByHop.contains(name) && !replaced && !listed.contains(name)
        }
    }

    /// Response headers passed to the client. `Content-Length` stays (evhttp then frames by it);
    /// `Transfer-Encoding` goes, since evhttp has already de-chunked the body and re-chunks as needed.
    /// Equal duplicate `Content-Length` fields (accepted, see `MessageFraming`) go out once.
    static func forwardedResponseHeaders(_ headers: [(name: String, value: String)]) -> [(name: String, value: String)] {
        let listed = connectionListed(headers)
        var sawLength = false
        return headers.filter { header in
            let name = HTTPSyntax.fieldKey(header.name)
            if name == "content-length" {
                defer { sawLength = true }
                return !sawLength
            }
            return !hopByHop.contains(name) && !listed.contains(name)
        }
    }
}

// MARK: - On the received bytes (the transport engine)

extension HeaderPolicy {
    /// `hopByHop`, for a name in bytes.
    static func isHopByHop(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 2: return ASCII.equalIgnoringCase(name, "te")
        case 7: return ASCII.equalIgnoringCase(name, "trailer") || ASCII.equalIgnoringCase(name, "upgrade")
        case 10: return ASCII.equalIgnoringCase(name, "connection") || ASCII.equalIgnoringCase(name, "keep-alive")
        case 16: return ASCII.equalIgnoringCase(name, "proxy-connection")
        case 17: return ASCII.equalIgnoringCase(name, "transfer-encoding")
        case 18: return ASCII.equalIgnoringCase(name, "proxy-authenticate")
        case 19: return ASCII.equalIgnoringCase(name, "proxy-authorization")
        default: return false
        }
    }

    /// `replacedOnRequest` without `authorization`, for a name in bytes.
    private static func isReplacedOnRequest(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 4: return ASCII.equalIgnoringCase(name, "host")
        case 6: return ASCII.equalIgnoringCase(name, "expect")
        case 14: return ASCII.equalIgnoringCase(name, "content-length")
        default: return false
        }
    }

    /// Whether the client's field `index` crosses to the upstream: `forwardedRequestHeaders`'s rule for
    /// one field. `injectedHeader` is the lower-cased name the token goes into.
    static func forwardsRequestField(_ index: Int, of table: FieldTable, keepAuthorization: Bool,
                                     injectedHeader: UnsafeRawBufferPointer) -> Bool {
        let name = table.name(index)
        let isAuthorization = ASCII.equalIgnoringCase(name, "authorization")
        let isInjected = ASCII.equalIgnoringCase(name, injectedHeader)
        if keepAuthorization && (isAuthorization || isInjected) { return true }
        if isInjected { return false }
        let replaced = isAuthorization ? ASCII.equalIgnoringCase(injectedHeader, "authorization") : isReplacedOnRequest(name)
        return !replaced && !isHopByHop(name) && !table.isConnectionListed(name)
    }

    /// Writes the response fields passed to the client (`forwardedResponseHeaders`' rule). The framing
    /// fields are the transport's: it writes the length or coding it frames the relayed body by.
    static func writeForwardedResponseFields(_ table: FieldTable, into block: inout HTTPFieldBlock) {
        for index in 0..<table.count {
            let name = table.name(index)
            if ASCII.equalIgnoringCase(name, "content-length") || isHopByHop(name) || table.isConnectionListed(name) { continue }
            block.append(name: name, value: table.value(index))
        }
    }
}
