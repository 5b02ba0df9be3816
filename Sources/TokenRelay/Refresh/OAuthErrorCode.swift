/// The `error` member of an OAuth error response (RFC 6749 §5.2), reduced to something safe to log and
/// to use as a metric label. Only a value shaped like a registered code (`invalid_grant`,
/// `SESSION_EXPIRED`) is kept: a server that echoes the request into `error` could otherwise put a
/// token into a log line or onto `/metrics`, and every distinct string would add a metric series.
enum OAuthErrorCode {
    static let unrecognised = "unrecognised"
    private static let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:")

    static func sanitized(_ raw: String) -> String {
        !raw.isEmpty && raw.count <= 64 && raw.allSatisfy(allowed.contains) ? raw : unrecognised
    }
}
