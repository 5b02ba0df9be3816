/// Parses JSON text (RFC 8259, UTF-8) into the trees described in `JSONValues.swift`.
///
/// Deliberately as lenient as the parser it replaced in two ways that `StrictJSON` then reports with a
/// line number (a trailing comma, a repeated key: the last one wins here), and strict everywhere else.
/// Token-endpoint answers are outside data: nesting is bounded (no stack exhaustion), a number a Double
/// cannot hold is an error (callers clamp and retry, see `TokenEndpointJSON`), and an error message
/// names a line and column, never the text around it (which may be a token).
enum JSONReader {
    struct SyntaxError: Error, Equatable, CustomStringConvertible {
        let reason: String
        let line: Int
        let column: Int
        var description: String { "\(reason) at line \(line), column \(column)" }
    }

    /// Deeper documents are refused: nothing tokenrelay reads nests past a handful of levels.
    static let maximumDepth = 512

    /// `fragmentsAllowed`: a bare string, number, literal as the whole document (token endpoints
    /// sometimes answer `"error"`); otherwise the document must be an object or an array.
    static func parse(_ bytes: some Collection<UInt8>, fragmentsAllowed: Bool = false) throws(SyntaxError) -> Any {
        var parser = Parser(bytes: Array(bytes))
        parser.skipByteOrderMark()
        parser.skipWhitespace()
        if !fragmentsAllowed, parser.current != UInt8(ascii: "{"), parser.current != UInt8(ascii: "[") {
            throw parser.error(parser.current == nil ? "no JSON value" : "JSON text does not start with an object or array")
        }
        let value = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.current == nil else { throw parser.error("unexpected text after the JSON value") }
        return value
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0
        var line = 1
        var lineStart = 0

        var current: UInt8? { index < bytes.count ? bytes[index] : nil }

        func error(_ reason: String) -> SyntaxError {
            SyntaxError(reason: reason, line: line, column: index - lineStart + 1)
        }

        mutating func skipByteOrderMark() {
            if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { index = 3; lineStart = 3 }
        }

        mutating func skipWhitespace() {
            while let byte = current, byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D {
                index += 1
                if byte == 0x0A { line += 1; lineStart = index }
            }
        }

        mutating func value(depth: Int) throws(SyntaxError) -> Any {
            skipWhitespace()
            guard let byte = current else { throw error("unexpected end of text") }
            switch byte {
            case UInt8(ascii: "{"): return try object(depth: depth + 1)
            case UInt8(ascii: "["): return try array(depth: depth + 1)
            case UInt8(ascii: "\""): return try string()
            case UInt8(ascii: "t"): try literal("true"); return true
            case UInt8(ascii: "f"): try literal("false"); return false
            case UInt8(ascii: "n"): try literal("null"); return JSONNull()
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
            default: throw error("invalid value")
            }
        }

        mutating func literal(_ word: StaticString) throws(SyntaxError) {
            let count = word.utf8CodeUnitCount
            let matches = index + count <= bytes.count
                && word.withUTF8Buffer { expected in bytes[index..<index + count].elementsEqual(expected) }
            guard matches else { throw error("invalid value") }
            index += count
        }

        mutating func object(depth: Int) throws(SyntaxError) -> [String: Any] {
            guard depth <= JSONReader.maximumDepth else { throw error("nested too deeply") }
            index += 1  // {
            var members: [String: Any] = [:]
            skipWhitespace()
            if current == UInt8(ascii: "}") { index += 1; return members }
            while true {
                skipWhitespace()
                guard current == UInt8(ascii: "\"") else { throw error("expected a string key") }
                let key = try string()
                skipWhitespace()
                guard current == UInt8(ascii: ":") else { throw error("expected ':' after a key") }
                index += 1
                members[key] = try value(depth: depth)
                skipWhitespace()
                switch current {
                case UInt8(ascii: ","):
                    index += 1
                    skipWhitespace()
                    // Trailing comma: accepted here, reported by StrictJSON for config and token files.
                    if current == UInt8(ascii: "}") { index += 1; return members }
                case UInt8(ascii: "}"):
                    index += 1
                    return members
                default:
                    throw error(current == nil ? "unexpected end of text" : "expected ',' or '}'")
                }
            }
        }

        mutating func array(depth: Int) throws(SyntaxError) -> [Any] {
            guard depth <= JSONReader.maximumDepth else { throw error("nested too deeply") }
            index += 1  // [
            var elements: [Any] = []
            skipWhitespace()
            if current == UInt8(ascii: "]") { index += 1; return elements }
            while true {
                elements.append(try value(depth: depth))
                skipWhitespace()
                switch current {
                case UInt8(ascii: ","):
                    index += 1
                    skipWhitespace()
                    if current == UInt8(ascii: "]") { index += 1; return elements }
                case UInt8(ascii: "]"):
                    index += 1
                    return elements
                default:
                    throw error(current == nil ? "unexpected end of text" : "expected ',' or ']'")
                }
            }
        }

        mutating func number() throws(SyntaxError) -> JSONNumber {
            let start = index
            var isInteger = true
            if current == UInt8(ascii: "-") { index += 1 }
            guard let first = current, Self.isDigit(first) else { throw error("invalid number") }
            index += 1
            if first != UInt8(ascii: "0") { skipDigits() }
            if current == UInt8(ascii: ".") {
                isInteger = false
                index += 1
                guard let byte = current, Self.isDigit(byte) else { throw error("invalid number") }
                skipDigits()
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                isInteger = false
                index += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { index += 1 }
                guard let byte = current, Self.isDigit(byte) else { throw error("invalid number") }
                skipDigits()
            }
            let text = String(decoding: bytes[start..<index], as: UTF8.self)
            if isInteger, let integer = Int(text) { return JSONNumber(integer) }
            guard let double = Double(text), double.isFinite else {
                index = start
                throw error("number out of range")
            }
            return JSONNumber(double)
        }

        private mutating func skipDigits() {
            while let byte = current, Self.isDigit(byte) { index += 1 }
        }

        private static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

        mutating func string() throws(SyntaxError) -> String {
            index += 1  // opening quote
            var utf8: [UInt8] = []
            while true {
                guard let byte = current else { throw error("unterminated string") }
                switch byte {
                case UInt8(ascii: "\""):
                    index += 1
                    guard let text = String(validating: utf8, as: UTF8.self) else { throw error("string is not valid UTF-8") }
                    return text
                case UInt8(ascii: "\\"):
                    index += 1
                    try escape(into: &utf8)
                case 0x00..<0x20:
                    throw error("control character in string")
                default:
                    utf8.append(byte)
                    index += 1
                }
            }
        }

        private mutating func escape(into utf8: inout [UInt8]) throws(SyntaxError) {
            guard let escaped = current else { throw error("unterminated string") }
            index += 1
            switch escaped {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): utf8.append(escaped)
            case UInt8(ascii: "b"): utf8.append(0x08)
            case UInt8(ascii: "f"): utf8.append(0x0C)
            case UInt8(ascii: "n"): utf8.append(0x0A)
            case UInt8(ascii: "r"): utf8.append(0x0D)
            case UInt8(ascii: "t"): utf8.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try hexQuad()
                if (0xD800...0xDBFF).contains(scalar) {
                    guard current == UInt8(ascii: "\\"), index + 1 < bytes.count, bytes[index + 1] == UInt8(ascii: "u") else {
                        throw error("unpaired surrogate in \\u escape")
                    }
                    index += 2
                    let low = try hexQuad()
                    guard (0xDC00...0xDFFF).contains(low) else { throw error("unpaired surrogate in \\u escape") }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00...0xDFFF).contains(scalar) {
                    throw error("unpaired surrogate in \\u escape")
                }
                guard let unicode = Unicode.Scalar(scalar) else { throw error("invalid \\u escape") }
                utf8.append(contentsOf: String(unicode).utf8)
            default:
                index -= 1
                throw error("invalid escape in string")
            }
        }

        private mutating func hexQuad() throws(SyntaxError) -> UInt32 {
            guard index + 4 <= bytes.count else { throw error("invalid \\u escape") }
            var value: UInt32 = 0
            for byte in bytes[index..<index + 4] {
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: throw error("invalid \\u escape")
                }
                value = value << 4 | UInt32(digit)
            }
            index += 4
            return value
        }
    }
}
