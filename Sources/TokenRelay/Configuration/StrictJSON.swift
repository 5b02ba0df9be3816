import FoundationEssentials

/// `JSONReader` accepts `{"a":1,}` and keeps only the last of two equal keys (as Foundation's parser did).
/// A hand-edited config or token file must mean exactly what it says (a second `"listen"` further down
/// silently winning is how a reviewed setting gets overridden), so both are refused.
///
/// Runs over text JSONReader has already accepted and looks only for those two things; anything
/// else unexpected ends the scan without a verdict, since the parser is the judge of the rest.
enum StrictJSON {
    enum ParseError: Error {
        /// JSONReader refused the text; its message names a line and column, never the text.
        case malformed(JSONReader.SyntaxError)
        case violation(Violation)
    }

    /// Every JSON document tokenrelay reads (config, token file, `token import`) goes through here:
    /// The parser, then the two checks it leaves out.
    static func parse(_ data: Data) throws(ParseError) -> Any {
        let json: Any
        do {
            json = try JSONReader.parse(data)
        } catch {
            throw .malformed(error)
        }
        if let violation = firstViolation(in: data) { throw .violation(violation) }
        return json
    }

    struct Violation: Error, Equatable {
        enum Kind: Equatable {
            case trailingComma
            /// The key's path in the document, e.g. `refresh.client_id` or `upstream.passthrough_prefixes[1].x`.
            case duplicateKey(path: String)
        }

        let kind: Kind
        let line: Int
    }

    static func firstViolation(in bytes: some Collection<UInt8>) -> Violation? {
        var scanner = Scanner(bytes: Array(bytes))
        scanner.skipByteOrderMark()
        do {
            try scanner.value(path: "")
            return nil
        } catch .violation(let violation) {
            return violation
        } catch {
            return nil
        }
    }

    private enum Stop: Error {
        case violation(Violation)
        case unexpected
    }

    private struct Scanner {
        let bytes: [UInt8]
        var index = 0
        var line = 1

        var current: UInt8? { index < bytes.count ? bytes[index] : nil }

        mutating func skipByteOrderMark() {
            if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { index = 3 }
        }

        mutating func skipWhitespace() {
            while let byte = current, byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D {
                if byte == 0x0A { line += 1 }
                index += 1
            }
        }

        mutating func expect(_ byte: UInt8) throws(Stop) {
            skipWhitespace()
            guard current == byte else { throw .unexpected }
            index += 1
        }

        mutating func value(path: String) throws(Stop) {
            skipWhitespace()
            switch current {
            case UInt8(ascii: "{"): try object(path: path)
            case UInt8(ascii: "["): try array(path: path)
            case UInt8(ascii: "\""): _ = try string()
            case nil: throw .unexpected
            default:
                // A number or a literal: the parser has vetted it, only its end matters here.
                while let byte = current, !Self.delimiters.contains(byte) { index += 1 }
            }
        }

        private static let delimiters: Set<UInt8> = Set(",]} \t\r\n".utf8)

        mutating func object(path: String) throws(Stop) {
            try expect(UInt8(ascii: "{"))
            skipWhitespace()
            if current == UInt8(ascii: "}") { index += 1; return }
            var keys: Set<String> = []
            while true {
                skipWhitespace()
                let keyLine = line
                let key = try string()
                let keyPath = path.isEmpty ? key : "\(path).\(key)"
                guard keys.insert(key).inserted else {
                    throw .violation(Violation(kind: .duplicateKey(path: keyPath), line: keyLine))
                }
                try expect(UInt8(ascii: ":"))
                try value(path: keyPath)
                guard try separatorOrEnd(closing: UInt8(ascii: "}")) else { return }
            }
        }

        mutating func array(path: String) throws(Stop) {
            try expect(UInt8(ascii: "["))
            skipWhitespace()
            if current == UInt8(ascii: "]") { index += 1; return }
            var position = 0
            while true {
                try value(path: "\(path)[\(position)]")
                guard try separatorOrEnd(closing: UInt8(ascii: "]")) else { return }
                position += 1
            }
        }

        /// After a member: true on a comma followed by another member, false on the closing bracket.
        mutating func separatorOrEnd(closing: UInt8) throws(Stop) -> Bool {
            skipWhitespace()
            if current == closing { index += 1; return false }
            let commaLine = line
            try expect(UInt8(ascii: ","))
            skipWhitespace()
            if current == closing { throw .violation(Violation(kind: .trailingComma, line: commaLine)) }
            return true
        }

        /// A string with its escapes decoded: `"list\u0065n"` is the same key as `"listen"`.
        mutating func string() throws(Stop) -> String {
            guard current == UInt8(ascii: "\"") else { throw .unexpected }
            index += 1
            var utf8: [UInt8] = []
            var pendingHighSurrogate: UInt32?
            while let byte = current {
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return String(decoding: utf8, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard let escaped = current else { throw .unexpected }
                    index += 1
                    if escaped == UInt8(ascii: "u") {
                        guard index + 4 <= bytes.count,
                              let code = UInt32(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16) else { throw .unexpected }
                        index += 4
                        if (0xD800...0xDBFF).contains(code) {
                            pendingHighSurrogate = code
                            continue
                        }
                        var scalarValue = code
                        if let high = pendingHighSurrogate, (0xDC00...0xDFFF).contains(code) {
                            scalarValue = 0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)
                        }
                        utf8.append(contentsOf: String(Unicode.Scalar(scalarValue) ?? "\u{FFFD}").utf8)
                    } else {
                        let simple: [UInt8: UInt8] = [UInt8(ascii: "n"): 0x0A, UInt8(ascii: "t"): 0x09, UInt8(ascii: "r"): 0x0D,
                                                      UInt8(ascii: "b"): 0x08, UInt8(ascii: "f"): 0x0C]
                        utf8.append(simple[escaped] ?? escaped)
                    }
                default:
                    utf8.append(byte)
                }
                pendingHighSurrogate = nil
            }
            throw .unexpected
        }
    }
}

extension StrictJSON.Violation: CustomStringConvertible {
    /// Key paths come from the document, so control characters are shown escaped to keep errors one line.
    var description: String {
        switch kind {
        case .trailingComma:
            return "trailing comma at line \(line)"
        case .duplicateKey(let path):
            let printable = path.unicodeScalars.map { $0.value < 0x20 ? $0.escaped(asASCII: true) : String($0) }.joined()
            return "duplicate key \(printable) at line \(line)"
        }
    }
}
