import FoundationEssentials

/// An RFC 6901 JSON Pointer (`/data/accessToken`, `/items/0`, `/a~1b` for the key `a/b`), parsed once at
/// start so that a malformed pointer is a config error, not a failure at the first refresh.
public struct JSONPointer: Sendable, Equatable, CustomStringConvertible {
    /// Reference tokens, unescaped (`~1` → `/`, `~0` → `~`).
    public let tokens: [String]
    public let description: String

    /// `""` is the whole document; anything else must start with `/`. `~` must be followed by `0` or `1`.
    public init(_ text: String) throws(JSONPointerError) {
        description = text
        guard !text.isEmpty else { tokens = []; return }
        guard text.hasPrefix("/") else { throw JSONPointerError("must be empty or start with /") }
        tokens = try text.dropFirst().split(separator: "/", omittingEmptySubsequences: false).map { raw throws(JSONPointerError) in
            try Self.unescape(raw)
        }
    }

    /// Unescapes one reference token left to right, so `~01` is `~1` (the key), never `/`.
    private static func unescape(_ raw: Substring) throws(JSONPointerError) -> String {
        var result = ""
        var iterator = raw.makeIterator()
        while let character = iterator.next() {
            guard character == "~" else { result.append(character); continue }
            switch iterator.next() {
            case "0": result.append("~")
            case "1": result.append("/")
            default: throw JSONPointerError("~ must be followed by 0 or 1 (write ~0 for ~ and ~1 for /)")
            }
        }
        return result
    }

    /// The value the pointer refers to in a `JSONReader` document, or nil if there is none. An
    /// array index is `0` or a number without leading zeros; `-` (past the end) never refers to a value.
    public func evaluate(_ document: Any) -> Any? {
        var current = document
        for token in tokens {
            if let object = current as? [String: Any] {
                guard let next = object[token] else { return nil }
                current = next
            } else if let array = current as? [Any] {
                guard let index = Self.arrayIndex(token), index < array.count else { return nil }
                current = array[index]
            } else {
                return nil
            }
        }
        return current
    }

    private static func arrayIndex(_ token: String) -> Int? {
        guard !token.isEmpty, token.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        guard token == "0" || !token.hasPrefix("0") else { return nil }
        return Int(token)
    }
}

public struct JSONPointerError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
