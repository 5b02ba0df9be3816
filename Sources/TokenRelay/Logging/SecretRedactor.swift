import Synchronization

/// Knows the secret values in play (access token, refresh token, client secret) and blanks them out of
/// any text that is about to leave the process as a log line or an error message.
///
/// Log lines are written so that no secret is ever put into them; this is the second line of defence for
/// text we do not control, such as an error body echoed by a token endpoint.
public final class SecretRedactor: Sendable {
    /// Tokens (replaced on every rotation) and fixed secrets such as the client secret (kept): a rotation
    /// must not drop the client secret from the list.
    private let secrets = Mutex<(tokens: [String], fixed: [String])>(([], []))

    public init() {}

    /// Adds the current tokens; the previous ones stay known for a while (an access token replaced by a
    /// proactive refresh is still valid). Short values are ignored to avoid blanking ordinary words.
    func update(_ values: [String?]) {
        let usable = values.compactMap { $0 }.filter { $0.count >= 6 }
        secrets.withLock { $0.tokens = Array((usable + $0.tokens.filter { !usable.contains($0) }).prefix(8)) }
    }

    func add(_ value: String?) {
        guard let value, value.count >= 6 else { return }
        secrets.withLock { $0.fixed.append(value) }
    }

    public func redact(_ text: String) -> String {
        let current = secrets.withLock { $0.tokens + $0.fixed }
        var result = text
        for secret in current where result.contains(secret) {
            result = result.replacing(secret, with: "[redacted]")
        }
        return result
    }
}
