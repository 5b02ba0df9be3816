import HTTPTransport

/// The de-facto proxy headers (`X-Forwarded-For`, `X-Forwarded-Proto`, `Via`) added to forwarded requests.
///
/// The upstream otherwise sees every request coming from tokenrelay's address. Each header can be
/// switched off (`forwarding.*`): some APIs treat `X-Forwarded-For` as an allow-list input, and a
/// sidecar that is meant to be invisible should then not add it.
enum ForwardingHeaders {
    /// Returns `headers` (the client's headers after hop-by-hop removal) with the forwarding headers
    /// updated for this hop. `clientAddress` is the peer address of the client connection.
    static func apply(to headers: [(name: String, value: String)], clientAddress: String?, settings: Config.Forwarding)
        -> [(name: String, value: String)] {
        var result = headers
        if settings.dropUnderscoreHeaders {
            // Many application servers (CGI, WSGI, PHP) read `X_User` and `X-User` as the same variable:
            // a client could pose as a header an earlier proxy removed.
            result.removeAll { $0.name.utf8.contains(UInt8(ascii: "_")) }
        }
        if settings.xForwardedFor, let clientAddress {
            // Appended, so an upstream that trusts a chain of proxies still sees it whole.
            appendToList("X-Forwarded-For", clientAddress, in: &result)
        }
        if settings.xForwardedProto {
            // Replaced, not appended: clients talk plain HTTP to tokenrelay, and a client must not be
            // able to claim otherwise.
            result.removeAll { HTTPSyntax.isField($0.name, "x-forwarded-proto") }
            result.append((name: "X-Forwarded-Proto", value: "http"))
        }
        if settings.via {
            appendToList("Via", "1.1 tokenrelay", in: &result)
        }
        return result
    }

    /// Folds every existing `name` field into one, with `element` appended (RFC 9110 §5.3).
    private static func appendToList(_ name: String, _ element: String, in headers: inout [(name: String, value: String)]) {
        let key = HTTPSyntax.fieldKey(name)
        let existing = headers.filter { HTTPSyntax.isField($0.name, key) }.map(\.value).filter { !$0.isEmpty }
        headers.removeAll { HTTPSyntax.isField($0.name, key) }
        headers.append((name: name, value: (existing + [element]).joined(separator: ", ")))
    }
}

// MARK: - On the received bytes (the transport engine)

extension ForwardingHeaders {
    /// Writes the client's fields that `forwarded` lets through, with the forwarding headers updated for
    /// this hop: the same fields, values and order as `apply(to:clientAddress:settings:)`, written straight
    /// into the upstream request's head.
    static func write(_ table: FieldTable, forwarded: (Int) -> Bool, clientAddress: String?, settings: Config.Forwarding,
                      into block: inout HTTPFieldBlock) {
        let foldsForwardedFor = settings.xForwardedFor && clientAddress != nil
        for index in 0..<table.count where forwarded(index) {
            if settings.dropUnderscoreHeaders && table.fields[index].nameHasUnderscore { continue }
            if foldsForwardedFor && table.nameIs(index, "x-forwarded-for") { continue }
            if settings.xForwardedProto && table.nameIs(index, "x-forwarded-proto") { continue }
            if settings.via && table.nameIs(index, "via") { continue }
            block.append(name: table.name(index), value: table.value(index))
        }
        if foldsForwardedFor, let clientAddress {
            appendToList("X-Forwarded-For", key: "x-forwarded-for", clientAddress, from: table, forwarded: forwarded, into: &block)
        }
        if settings.xForwardedProto { block.append(name: "X-Forwarded-Proto", value: "http") }
        if settings.via { appendToList("Via", key: "via", "1.1 tokenrelay", from: table, forwarded: forwarded, into: &block) }
    }

    /// One `name` field: the non-empty values of the forwarded `key` fields, then `element`, joined by ", ".
    private static func appendToList(_ name: String, key: StaticString, _ element: String, from table: FieldTable,
                                     forwarded: (Int) -> Bool, into block: inout HTTPFieldBlock) {
        block.startField(name: name)
        for index in 0..<table.count where table.nameIs(index, key) && !table.value(index).isEmpty && forwarded(index) {
            block.appendToValue(table.value(index))
            block.appendToValue(", ")
        }
        block.appendToValue(element)
        block.endField()
    }
}
