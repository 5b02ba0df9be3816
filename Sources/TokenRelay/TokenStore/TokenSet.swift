import FoundationEssentials

/// The credentials tokenrelay works with, plus whatever else the token file holds (kept verbatim on
/// rewrite, so hand-written metadata survives a refresh).
struct TokenSet {
    var accessToken: String
    var refreshToken: String?
    var expiresAt: Date?
    /// Keys of the token file that tokenrelay does not interpret.
    var otherFields: [String: Any] = [:]

    /// A token goes into a header value verbatim, so only visible ASCII is acceptable: a CR or LF would
    /// let a token endpoint (or a hand-edited file) inject headers into every proxied request.
    static func isHeaderSafe(_ token: String) -> Bool {
        !token.isEmpty && token.utf8.allSatisfy { $0 >= 0x21 && $0 <= 0x7E }
    }

    /// The longest token accepted, access or refresh. The access token rides on every proxied request:
    /// a server (or a hand-edited file) that hands out a 100 KB one would make each request that much
    /// larger, and most upstreams refuse header blocks that big anyway.
    static let maximumTokenBytes = 16 * 1024

    /// Why `token` cannot be used as is ("… is longer than …", "… contains characters …"), or nil.
    static func unusableReason(_ token: String) -> String? {
        if token.utf8.count > maximumTokenBytes { return "is longer than \(maximumTokenBytes) bytes" }
        if !isHeaderSafe(token) { return "contains characters not allowed in an HTTP header" }
        return nil
    }
}

/// Time formats of the token file: RFC 3339 in UTC, fractional seconds accepted on input.
enum Timestamp {
    /// 9999-12-31T23:59:59Z, the last time RFC 3339 can write.
    static let latestRepresentable: Double = 253_402_300_799

    static func format(_ date: Date) -> String {
        RFC3339.format(date)
    }

    /// A JSON number of seconds, or one sent as a string (many servers do); never a boolean.
    static func seconds(_ value: Any?) -> Double? {
        if let number = value as? JSONNumber { return number.doubleValue.isFinite ? number.doubleValue : nil }
        if let text = value as? String, let double = Double(text), double.isFinite { return double }
        return nil
    }

    /// RFC 3339 text, or epoch seconds as a number or numeric string.
    static func date(_ value: Any) -> Date? {
        if let text = value as? String, let date = parse(text) { return date }
        return seconds(value).map(Date.init(timeIntervalSince1970:))
    }

    static func parse(_ text: String) -> Date? {
        RFC3339.parse(text)
    }
}
