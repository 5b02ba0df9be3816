import HTTPTransport

/// The de-facto proxy headers (`X-Forwarded-For`, `X-Forwarded-Proto`, `Via`) added to forwarded requests.
///
/// The upstream otherwise sees every request coming from tokenrelay's address. Each header can be
/// switched off (`forwarding.*`): some APIs treat `X-Forwarded-For` as an allow-list input, and a
/// sidecar that is meant to be invisible should then not add it.
enum ForwardingHeaders {
    /// Writes the client's fields that `forwarded` lets through (`HeaderPolicy`), in order, with the
    /// forwarding headers updated for this hop after them: `X-Forwarded-For` with `client`'s address (the
    /// client connection's peer) appended, `X-Forwarded-Proto: http`, `Via` with `1.1 tokenrelay`
    /// appended. Each as `settings` allows.
    static func write(_ table: FieldTable, forwarded: (Int) -> Bool, client: ForwardedClient?, settings: Config.Forwarding,
                      into block: inout HTTPFieldBlock) {
        let foldsForwardedFor = settings.xForwardedFor && client != nil
        // Whether the client brought a list (a forwarded field with a value) to fold; noted on the way.
        var listsForwardedFor = false, listsVia = false
        for index in 0..<table.count where forwarded(index) {
            // Many application servers (CGI, WSGI, PHP) read `X_User` and `X-User` as the same variable:
            // a client could pose as a header an earlier proxy removed.
            if settings.dropUnderscoreHeaders && table.fields[index].nameHasUnderscore { continue }
            // Folded into one field below (an upstream that trusts a chain of proxies still sees it whole),
            // or replaced: clients talk plain HTTP to tokenrelay, and a client must not be able to claim otherwise.
            if foldsForwardedFor && table.nameIs(index, "x-forwarded-for") {
                if !table.value(index).isEmpty { listsForwardedFor = true }
                continue
            }
            if settings.xForwardedProto && table.nameIs(index, "x-forwarded-proto") { continue }
            if settings.via && table.nameIs(index, "via") {
                if !table.value(index).isEmpty { listsVia = true }
                continue
            }
            block.appendReceived(index, of: table.received)
        }
        if foldsForwardedFor, let client {
            if listsForwardedFor {
                appendToList("X-Forwarded-For", key: "x-forwarded-for", client.address, from: table, forwarded: forwarded, into: &block)
            } else if let field = client.onlyForwardedFor {
                block.append(field)
            }
        }
        if settings.xForwardedProto, let proto = forwardedProto { block.append(proto) }
        if settings.via {
            if listsVia {
                appendToList("Via", key: "via", "1.1 tokenrelay", from: table, forwarded: forwarded, into: &block)
            } else if let via = onlyVia {
                block.append(via)
            }
        }
    }

    /// The fields written the same way into every request, made once.
    private static let forwardedProto = PreparedField(name: "X-Forwarded-Proto", value: "http")
    /// `Via` when the client sent none.
    private static let onlyVia = PreparedField(name: "Via", value: "1.1 tokenrelay")

    /// One `name` field: the non-empty values of the forwarded `key` fields, then `element`, joined by ", "
    /// (RFC 9110 §5.3).
    private static func appendToList(_ name: StaticString, key: StaticString, _ element: String, from table: FieldTable,
                                     forwarded: (Int) -> Bool, into block: inout HTTPFieldBlock) {
        block.startField(name: name)
        for index in 0..<table.count where table.nameIs(index, key) && !table.value(index).isEmpty && forwarded(index) {
            block.appendReceivedValue(index, of: table.received)
            block.appendToValue(", ")
        }
        block.appendToValue(element)
        block.endField()
    }
}

/// A client connection's address as the forwarding headers carry it: as text, to end a list the client
/// brought, and as the whole `X-Forwarded-For` field for the usual request that brings none (made and
/// checked once per client connection, not once per request).
struct ForwardedClient {
    let address: String
    let onlyForwardedFor: PreparedField?

    init(address: String) {
        self.address = address
        onlyForwardedFor = PreparedField(name: "X-Forwarded-For", value: address)
    }
}
