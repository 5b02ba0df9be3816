/// Writes the trees described in `JSONValues.swift` as JSON text, in the layout the token file, /status
/// and the in-flight record have always had (so diffs of a token file across versions stay empty):
/// `prettyPrinted` indents by two spaces with `"key" : value`; `/` is written `\/` unless
/// `escapingSlashes` is off; keys are sorted when asked.
enum JSONWriter {
    struct Options: OptionSet, Sendable {
        let rawValue: Int
        static let prettyPrinted = Options(rawValue: 1 << 0)
        static let sortedKeys = Options(rawValue: 1 << 1)
        /// Without this, `/` is escaped as `\/` (harmless, and what the token file has always held).
        static let withoutEscapingSlashes = Options(rawValue: 1 << 2)
        /// A bare string, number, literal may be the whole document.
        static let fragmentsAllowed = Options(rawValue: 1 << 3)
    }

    struct UnsupportedValue: Error, CustomStringConvertible {
        let description: String
    }

    static func data(_ value: Any, options: Options = []) throws(UnsupportedValue) -> [UInt8] {
        if !options.contains(.fragmentsAllowed), !(value is [String: Any]), !(value is [Any]) {
            throw UnsupportedValue(description: "a JSON document must be an object or an array")
        }
        var writer = Writer(options: options)
        try writer.write(value)
        return writer.output
    }

    /// The same as text.
    static func string(_ value: Any, options: Options = []) throws(UnsupportedValue) -> String {
        String(decoding: try data(value, options: options), as: UTF8.self)
    }

    private struct Writer {
        let options: Options
        var output: [UInt8] = []
        var indent = 0

        init(options: Options) { self.options = options }

        var pretty: Bool { options.contains(.prettyPrinted) }

        mutating func write(_ value: Any) throws(UnsupportedValue) {
            switch value {
            case let object as [String: Any]: try writeObject(object)
            case let array as [Any]: try writeArray(array)
            case let string as String: writeString(string)
            case let string as Substring: writeString(String(string))
            case let bool as Bool: append(bool ? "true" : "false")
            case let number as JSONNumber: try writeNumber(number)
            case is JSONNull: append("null")
            case let integer as any BinaryInteger: append(String(describing: integer))
            case let double as Double: try writeNumber(JSONNumber(double))
            case let float as any BinaryFloatingPoint: try writeNumber(JSONNumber(Double(float)))
            default:
                // An Optional inside Any lands here: a builder forgot to map nil to JSONNull.
                throw UnsupportedValue(description: "a value of type \(type(of: value)) cannot be written as JSON")
            }
        }

        private mutating func writeNumber(_ number: JSONNumber) throws(UnsupportedValue) {
            guard number.doubleValue.isFinite else { throw UnsupportedValue(description: "a number must be finite in JSON") }
            append(number.description)
        }

        private mutating func writeArray(_ array: [Any]) throws(UnsupportedValue) {
            append("[")
            if pretty { append("\n"); indent += 2 }
            for (position, element) in array.enumerated() {
                if position > 0 { append(pretty ? ",\n" : ",") }
                if pretty { writeIndent() }
                try write(element)
            }
            if pretty { append("\n"); indent -= 2; writeIndent() }
            append("]")
        }

        private mutating func writeObject(_ object: [String: Any]) throws(UnsupportedValue) {
            append("{")
            if pretty { append("\n"); indent += 2 }
            let members = options.contains(.sortedKeys) ? object.sorted { JSONWriter.keyPrecedes($0.key, $1.key) } : Array(object)
            for (position, member) in members.enumerated() {
                if position > 0 { append(pretty ? ",\n" : ",") }
                if pretty { writeIndent() }
                writeString(member.key)
                append(pretty ? " : " : ":")
                try write(member.value)
            }
            if pretty { append("\n"); indent -= 2; writeIndent() }
            append("}")
        }

        private mutating func writeIndent() {
            output.append(contentsOf: repeatElement(UInt8(ascii: " "), count: indent))
        }

        private mutating func append(_ text: String) { output.append(contentsOf: text.utf8) }

        private static let hexDigits = Array("0123456789abcdef".utf8)

        private mutating func writeString(_ string: String) {
            output.append(UInt8(ascii: "\""))
            for byte in string.utf8 {
                switch byte {
                case UInt8(ascii: "\""): append("\\\"")
                case UInt8(ascii: "\\"): append("\\\\")
                case UInt8(ascii: "/"): append(options.contains(.withoutEscapingSlashes) ? "/" : "\\/")
                case 0x08: append("\\b")
                case 0x0C: append("\\f")
                case 0x0A: append("\\n")
                case 0x0D: append("\\r")
                case 0x09: append("\\t")
                case 0x00..<0x20:
                    append("\\u00")
                    output.append(Self.hexDigits[Int(byte >> 4)])
                    output.append(Self.hexDigits[Int(byte & 0x0F)])
                default:
                    output.append(byte)
                }
            }
            output.append(UInt8(ascii: "\""))
        }
    }

    /// Key order for `sortedKeys`, the order JSONSerialization wrote, so that a token file written by an
    /// earlier version is rewritten byte for byte: its collation for ASCII keys, which is
    /// case-insensitive, puts punctuation (`_` first, then `-`) before digits and digits before letters,
    /// and compares runs of digits by value (`a9` before `a10`); a tie goes to lowercase, then to the
    /// scalar values. (Non-ASCII letters sort after all ASCII here; Foundation sorted `é` next to `e`.)
    static func keyPrecedes(_ a: String, _ b: String) -> Bool {
        let left = Array(a.unicodeScalars), right = Array(b.unicodeScalars)
        var i = 0, j = 0
        while i < left.count, j < right.count {
            if isDigit(left[i]), isDigit(right[j]) {
                let leftRun = digitRun(left, from: &i), rightRun = digitRun(right, from: &j)
                if leftRun != rightRun {
                    return leftRun.count != rightRun.count ? leftRun.count < rightRun.count : leftRun.lexicographicallyPrecedes(rightRun)
                }
                continue
            }
            let x = weight(left[i]), y = weight(right[j])
            if x != y { return x < y }
            i += 1
            j += 1
        }
        if (i < left.count) != (j < right.count) { return j < right.count }
        // Equal when case and leading zeros are ignored: a fixed tie-break so the order is total.
        for (x, y) in zip(left, right) where x != y {
            let xLower = x.properties.isLowercase, yLower = y.properties.isLowercase
            if xLower != yLower { return xLower }
            return x.value < y.value
        }
        return left.count < right.count
    }

    /// ASCII whitespace, punctuation and symbols in collation order; digits and letters come after them.
    private static let asciiOrder = Array("\t\n\u{0B}\u{0C}\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$".unicodeScalars)
    private static let digitWeight: UInt32 = 200
    private static let letterBase: UInt32 = 300

    private static func weight(_ scalar: Unicode.Scalar) -> UInt32 {
        if isDigit(scalar) { return digitWeight }
        switch scalar.value {
        case 0x41...0x5A: return letterBase + scalar.value - 0x41
        case 0x61...0x7A: return letterBase + scalar.value - 0x61
        default:
            if let position = asciiOrder.firstIndex(of: scalar) { return 100 + UInt32(position) }
            if scalar.isASCII { return 50 }  // other control characters: before everything printable
            let lower = scalar.properties.lowercaseMapping.unicodeScalars.first ?? scalar
            return 1_000 + lower.value
        }
    }

    private static func isDigit(_ scalar: Unicode.Scalar) -> Bool { scalar.value >= 0x30 && scalar.value <= 0x39 }

    /// The digits from `index` on, leading zeros dropped (compared by length, then digit by digit).
    private static func digitRun(_ scalars: [Unicode.Scalar], from index: inout Int) -> [UInt32] {
        var run: [UInt32] = []
        while index < scalars.count, isDigit(scalars[index]) {
            if !(run.isEmpty && scalars[index] == "0") { run.append(scalars[index].value) }
            index += 1
        }
        return run
    }
}
