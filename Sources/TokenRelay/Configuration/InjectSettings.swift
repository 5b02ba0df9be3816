/// How the access token is presented to the upstream (`inject.header`, `inject.format`). Many APIs are not
/// textbook RFC 6750: mobile backends want `accessToken: <token>` or a scheme of their own.
public struct InjectSettings: Sendable, Equatable {
    public static let placeholder = "{token}"

    /// Header field name, as configured (the client's fields of this name are always dropped).
    public var header = "Authorization" { didSet { headerKey = header.lowercased() } }
    /// Lower-cased header name, for comparisons with incoming fields (kept, not recomputed per request).
    private(set) var headerKey = "authorization"
    /// Header value with `{token}` exactly once.
    public var format = "Bearer {token}"

    public init() {}

    /// The header value for `token`. Tokens are checked to be visible ASCII before they are used
    /// (`TokenSet.isHeaderSafe`), and the format at start, so the result is always a valid field value.
    public func value(for token: String) -> String {
        format.replacing(Self.placeholder, with: token)
    }

    static func read(from root: JSONObjectReader) throws -> InjectSettings {
        var settings = InjectSettings()
        guard let object = try root.optionalObject("inject") else { return settings }
        if let header = try object.optionalString("header") {
            guard HTTPSyntax.isToken(header) else {
                throw ConfigError(object.fieldPath("header"), "must be an HTTP header name (RFC 9110 token characters only)")
            }
            guard !HTTPSyntax.reservedHeaderNames.contains(header.lowercased()) else {
                throw ConfigError(object.fieldPath("header"), "\(header) is set by tokenrelay itself and cannot carry the token")
            }
            settings.header = header
        }
        if let format = try object.optionalString("format") {
            guard format.ranges(of: placeholder).count == 1 else {
                throw ConfigError(object.fieldPath("format"), "must contain \(placeholder) exactly once")
            }
            guard HTTPSyntax.isSafeHeaderValue(format) else {
                throw ConfigError(object.fieldPath("format"), "must not contain control characters (CR, LF, ...)")
            }
            settings.format = format
        }
        try object.rejectUnknownKeys()
        return settings
    }
}
