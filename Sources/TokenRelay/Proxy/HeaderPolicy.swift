import HTTPTransport

/// Which header fields cross the proxy, in each direction (RFC 9110 §7.6.1), decided on the bytes of the
/// received head (`FieldTable`) and written straight into the head that goes on.
///
/// Never forwarded: hop-by-hop fields (they describe one connection, not the message): Connection,
/// Keep-Alive, Proxy-Connection, TE, Trailer, Transfer-Encoding, Upgrade, Proxy-Authenticate,
/// Proxy-Authorization, and every name a Connection field lists. On requests tokenrelay also sets some
/// fields itself: framing is redone (Content-Length), Host names the upstream, credentials are injected (a
/// client's own Authorization must never reach the upstream), and Expect is the transport's to send.
enum HeaderPolicy {
    /// A hop-by-hop field name (see above).
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

    /// Request fields tokenrelay sets itself, apart from Authorization (whose rule depends on `inject.header`).
    private static func isReplacedOnRequest(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        // A client's own DPoP proof cannot match the token tokenrelay injects (it signs its own).
        case 4: return ASCII.equalIgnoringCase(name, "host") || ASCII.equalIgnoringCase(name, "dpop")
        case 6: return ASCII.equalIgnoringCase(name, "expect")
        case 14: return ASCII.equalIgnoringCase(name, "content-length")
        default: return false
        }
    }

    /// Whether the client's field `index` crosses to the upstream.
    /// - Parameters:
    ///   - keepAuthorization: only for passthrough paths, where tokenrelay injects nothing: the client's
    ///     `Authorization` and its field named `injectedHeader` are kept.
    ///   - injectedHeader: the lower-cased header tokenrelay puts the token into (`inject.header`). The client's
    ///     fields of that name are always dropped; its own `Authorization` is kept when the token goes
    ///     elsewhere, since it then carries the client's own credentials for the API, not the ones tokenrelay manages.
    static func forwardsRequestField(_ index: Int, of table: FieldTable, keepAuthorization: Bool,
                                     injectedHeader: UnsafeRawBufferPointer) -> Bool {
        let name = table.name(index)
        let isAuthorization = ASCII.equalIgnoringCase(name, "authorization")
        let isInjected = ASCII.equalIgnoringCase(name, injectedHeader)
        if keepAuthorization && (isAuthorization || isInjected || (name.count == 4 && ASCII.equalIgnoringCase(name, "dpop"))) { return true }
        if isInjected { return false }
        let replaced = isAuthorization ? ASCII.equalIgnoringCase(injectedHeader, "authorization") : isReplacedOnRequest(name)
        return !replaced && !isHopByHop(name) && !isListedBesidesHopByHop(name, in: table)
    }

    /// Whether a name that is not hop-by-hop itself is listed in a `Connection` field. Of the options
    /// HTTPWire sorted the listed elements into, keep-alive and upgrade name hop-by-hop fields already:
    /// unless another token was listed, only `close` can be such a name (the field table is not read again).
    @inline(__always)
    private static func isListedBesidesHopByHop(_ name: UnsafeRawBufferPointer, in table: FieldTable) -> Bool {
        let connection = table.connection
        if !connection.contains(.otherTokens) { return connection.contains(.close) && ASCII.equalIgnoringCase(name, "close") }
        return table.isConnectionListed(name)
    }

    /// Content-Length (the transport frames the relayed body itself) or a hop-by-hop field: one look at
    /// the length, then at most two comparisons.
    private static func isDroppedFromResponse(_ name: UnsafeRawBufferPointer) -> Bool {
        name.count == 14 ? ASCII.equalIgnoringCase(name, "content-length") : isHopByHop(name)
    }

    /// Writes the response fields passed to the client: all but the hop-by-hop ones. The framing fields are
    /// the transport's: it writes the length or coding it frames the relayed body by (equal duplicate
    /// Content-Length fields, which HTTPWire accepts on a response, go out once that way).
    static func writeForwardedResponseFields(_ table: FieldTable, into block: inout HTTPFieldBlock) {
        for index in 0..<table.count {
            let name = table.name(index)
            if isDroppedFromResponse(name) || isListedBesidesHopByHop(name, in: table) { continue }
            block.appendReceived(index, of: table.received)
        }
    }
}
