import HTTPTransport

/// The token header (`inject.header` with the current token's value) as a prepared field: checked and laid
/// out once per token instead of once per request. A value the transport would not send (a token with a
/// control character, which `TokenSet.isHeaderSafe` already keeps out) makes no field, and the request goes
/// without it, as `HTTPFieldBlock.append(name:value:)` would have left it out.
final class TokenHeaderField {
    private let header: String
    /// The value the field was made for, and the field.
    private var made: (value: String, field: PreparedField?)?

    /// A route's own `inject.format` over its identity's value, which the coordinator formats with the
    /// top-level one: the token between that format's prefix and suffix goes between this one's.
    struct Reformat {
        let fromPrefix: String
        let fromSuffix: String
        let target: InjectSettings

        init(from source: InjectSettings, to target: InjectSettings) {
            let parts = source.format.split(separator: InjectSettings.placeholder, maxSplits: 1, omittingEmptySubsequences: false)
            fromPrefix = String(parts.first ?? "")
            fromSuffix = parts.count > 1 ? String(parts[1]) : ""
            self.target = target
        }

        /// Nil when `value` was not made with the source format (a DPoP-bound token's `DPoP` scheme): it goes as it is.
        func value(for value: String) -> String? {
            guard !value.hasPrefix(DPoPProofs.authorizationScheme) || fromPrefix.hasPrefix(DPoPProofs.authorizationScheme),
                  value.count >= fromPrefix.count + fromSuffix.count, value.hasPrefix(fromPrefix), value.hasSuffix(fromSuffix) else { return nil }
            return target.value(for: String(value.dropFirst(fromPrefix.count).dropLast(fromSuffix.count)))
        }
    }

    private let reformat: Reformat?

    init(header: String, reformat: Reformat? = nil) {
        self.header = header
        self.reformat = reformat
    }

    /// The field for `value`. Every request under one token brings the same String (the refresh
    /// coordinator keeps one per token generation), whose comparison with the kept one is a look at two
    /// words; another token makes a new field.
    func field(for value: String) -> PreparedField? {
        if let made, made.value == value { return made.field }
        let field = PreparedField(name: header, value: reformat?.value(for: value) ?? value)
        made = (value, field)
        return field
    }
}
