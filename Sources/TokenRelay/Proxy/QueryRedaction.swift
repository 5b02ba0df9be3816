/// The query of a logged path with the values of credential-like parameters replaced by `[redacted]`.
/// `log.access_query` is for seeing which resource a client asked for; a legacy client that puts its own
/// credentials in the URL (`?access_token=…`, a pre-signed `X-Amz-Signature`, `?api_key=…`) must not get
/// them written to the log by it. A parameter counts as a credential when its name (any case, `-` or `_`)
/// is or contains one of `credentialNameParts`; names and other values are kept byte for byte.
///
/// The name is judged as the application server reads it: percent-decoded (`%74oken` is `token`), and
/// parameters end at `;` as well as `&` (many servers and older query parsers split on both). Judged on
/// the raw text, either spelling would carry a credential past the redaction into the log. A fragment
/// (`#`, which a client forwarding a whole URL sends; the implicit grant puts `access_token` there) is read
/// as more parameters.
enum QueryRedaction {
    /// Where the query (or a fragment) of a logged path begins.
    static func startsQuery(_ character: Character) -> Bool { character == "?" || character == "#" }

    static let credentialNameParts = ["token", "secret", "password", "passwd", "key", "signature", "sig",
                                      "auth", "code", "session", "credential", "assertion"]

    static func redact(_ path: String) -> String {
        guard let question = path.firstIndex(where: startsQuery) else { return path }
        var redacted = String(path[...question])
        var parameterStart = path.index(after: question)
        var index = parameterStart
        while true {
            let atEnd = index == path.endIndex
            if atEnd || path[index] == "&" || path[index] == ";" || path[index] == "#" {
                redacted += redactParameter(path[parameterStart..<index])
                if atEnd { break }
                redacted.append(path[index])
                parameterStart = path.index(after: index)
            }
            index = path.index(after: index)
        }
        return redacted
    }

    private static func redactParameter(_ parameter: Substring) -> String {
        guard let equals = parameter.firstIndex(of: "=") else { return String(parameter) }
        let name = parameter[..<equals]
        return isCredentialName(name) ? "\(name)=[redacted]" : String(parameter)
    }

    static func isCredentialName(_ name: Substring) -> Bool {
        let folded = percentDecoded(name).lowercased()
        return credentialNameParts.contains { folded.contains($0) }
    }

    /// `text` with each `%` and two hex digits replaced by the byte they name (other `%` kept as they are).
    private static func percentDecoded(_ text: Substring) -> String {
        guard text.contains("%") else { return String(text) }
        let bytes = Array(text.utf8)
        var decoded: [UInt8] = []
        decoded.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count, let high = hexDigit(bytes[i + 1]), let low = hexDigit(bytes[i + 2]) {
                decoded.append(high << 4 | low)
                i += 3
            } else {
                decoded.append(bytes[i])
                i += 1
            }
        }
        return String(decoding: decoded, as: UTF8.self)
    }

    private static func hexDigit(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}
