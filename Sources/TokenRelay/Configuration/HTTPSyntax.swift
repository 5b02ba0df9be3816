/// The bits of RFC 9110 syntax the config must check before anything reaches the wire: header names
/// and header values built from configured templates.
enum HTTPSyntax {
    /// `token = 1*tchar` (RFC 9110 §5.6.2): what a header field name may be.
    static func isToken(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"):
                return true
            default:
                return "!#$%&'*+-.^_`|~".utf8.contains(byte)
            }
        }
    }

    /// A header value may hold visible ASCII, spaces, tabs and (obsolete but legal) high bytes; never CR,
    /// LF, NUL or another control character, which would end the field and let the value inject headers.
    static func isSafeHeaderValue(_ text: String) -> Bool {
        text.utf8.allSatisfy { $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) }
    }

    /// A field name as a lookup key: ASCII-lowercased (field names are ASCII tokens; Unicode case mapping
    /// would be both wrong and slow on the per-request path). Allocates only when there is an upper-case letter.
    static func fieldKey(_ name: String) -> String {
        guard name.utf8.contains(where: { $0 >= 0x41 && $0 <= 0x5A }) else { return name }
        return String(decoding: name.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }, as: UTF8.self)
    }

    /// Whether field name `name` is `lowercasedKey`, ignoring ASCII case, without allocating.
    static func isField(_ name: String, _ lowercasedKey: String) -> Bool {
        name.utf8.count == lowercasedKey.utf8.count
            && zip(name.utf8, lowercasedKey.utf8).allSatisfy { ($0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0) == $1 }
    }

    /// `text` without leading and trailing optional whitespace (RFC 9110 §5.6.3: spaces and tabs).
    static func trimmedOWS(_ text: Substring) -> Substring {
        let isWhitespace = { (c: Character) in c == " " || c == "\t" }
        guard let first = text.firstIndex(where: { !isWhitespace($0) }), let last = text.lastIndex(where: { !isWhitespace($0) }) else {
            return ""
        }
        return text[first...last]
    }

    /// Headers tokenrelay frames itself (or that describe one connection): a configured header of these
    /// names would corrupt the message instead of authenticating it.
    static let reservedHeaderNames: Set<String> = [
        "host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade",
        "expect", "proxy-connection",
    ]
}
