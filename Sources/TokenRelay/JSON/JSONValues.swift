/// What `JSONReader` produces and `JSONWriter` accepts, as untyped trees (`Any`) the way the config,
/// token file and token-endpoint code reads them field by field:
///
/// | JSON      | Swift                      |
/// |-----------|----------------------------|
/// | object    | `[String: Any]`            |
/// | array     | `[Any]`                    |
/// | string    | `String`                   |
/// | true/false| `Bool`                     |
/// | number    | `JSONNumber`               |
/// | null      | `JSONNull`                 |
///
/// A number is its own type, never `Bool`, `Int` or `Double`: a reader asking for a number must not
/// accept `true`, and one asking for a flag must not accept `1`. The writer also takes Swift's `Int`,
/// `Double` and the other integer types, for documents built in code (/status, the demo's config).

/// A JSON number: its value as a Double (what every reader uses) and, when the text was a whole number
/// that fits, as an Int, so that writing it back gives `3`, not `3.0`.
struct JSONNumber: Sendable, Equatable, CustomStringConvertible {
    let doubleValue: Double
    /// Set when the number was written without fraction or exponent and fits in an Int.
    let exactInteger: Int?

    init(_ value: Double) {
        doubleValue = value
        exactInteger = nil
    }

    init(_ value: Int) {
        doubleValue = Double(value)
        exactInteger = value
    }

    /// The whole number nearest the value, clamped to Int's range (never traps).
    var intValue: Int {
        if let exactInteger { return exactInteger }
        guard doubleValue.isFinite else { return doubleValue > 0 ? .max : (doubleValue < 0 ? .min : 0) }
        if doubleValue >= 9.2e18 { return .max }
        if doubleValue <= -9.2e18 { return .min }
        return Int(doubleValue)
    }

    /// As JSON text: an integer as digits, any other value in Swift's shortest round-trip form with a
    /// trailing `.0` dropped (`1e+20`, `0.5`, `2`).
    var description: String {
        if let exactInteger { return String(exactInteger) }
        var text = doubleValue.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        return text
    }
}

/// JSON `null` inside a tree (an absent key is simply absent).
struct JSONNull: Sendable, Equatable {}
