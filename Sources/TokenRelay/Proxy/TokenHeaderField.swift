import HTTPTransport

/// The token header (`inject.header` with the current token's value) as a prepared field: checked and laid
/// out once per token instead of once per request. A value the transport would not send (a token with a
/// control character, which `TokenSet.isHeaderSafe` already keeps out) makes no field, and the request goes
/// without it, as `HTTPFieldBlock.append(name:value:)` would have left it out.
final class TokenHeaderField {
    private let header: String
    /// The value the field was made for, and the field.
    private var made: (value: String, field: PreparedField?)?

    init(header: String) {
        self.header = header
    }

    /// The field for `value`. Every request under one token brings the same String (the refresh
    /// coordinator keeps one per token generation), whose comparison with the kept one is a look at two
    /// words; another token makes a new field.
    func field(for value: String) -> PreparedField? {
        if let made, made.value == value { return made.field }
        let field = PreparedField(name: header, value: value)
        made = (value, field)
        return field
    }
}
