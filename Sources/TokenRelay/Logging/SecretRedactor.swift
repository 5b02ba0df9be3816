import Synchronization

/// Knows the secret values in play (access token, refresh token, client secret) and blanks them out of
/// any text that is about to leave the process as a log line or an error message.
///
/// Log lines are written so that no secret is ever put into them; this is the second line of defence for
/// text we do not control, such as an error body echoed by a token endpoint.
public final class SecretRedactor: Sendable {
    /// Tokens (replaced on every rotation) and fixed secrets such as the client secret (kept): a rotation
    /// must not drop the client secret from the list.
    /// Tokens are kept per identity: one identity's rotations must never push another's tokens out.
    private let secrets = Mutex<(tokens: [String: [String]], fixed: [String])>(([:], []))
    /// For an identity's view (`forIdentity`): the redactor holding the secrets, and the identity's slot.
    private let parent: SecretRedactor?
    private let slot: String

    public init() {
        parent = nil
        slot = ""
    }

    private init(parent: SecretRedactor, slot: String) {
        self.parent = parent
        self.slot = slot
    }

    /// The redactor a named identity's coordinator updates: the same list of secrets, its own token slot.
    func forIdentity(_ name: String) -> SecretRedactor {
        SecretRedactor(parent: parent ?? self, slot: "identity:" + name)
    }

    /// Adds the current tokens; the previous ones stay known for a while (an access token replaced by a
    /// proactive refresh is still valid). Short values are ignored to avoid blanking ordinary words.
    func update(_ values: [String?]) {
        if let parent { return parent.update(values, slot: slot) }
        update(values, slot: slot)
    }

    private func update(_ values: [String?], slot: String) {
        let usable = values.compactMap { $0 }.filter { $0.count >= 6 }
        secrets.withLock { $0.tokens[slot] = Array((usable + ($0.tokens[slot] ?? []).filter { !usable.contains($0) }).prefix(8)) }
    }

    func add(_ value: String?) {
        if let parent { return parent.add(value) }
        guard let value, value.count >= 6 else { return }
        secrets.withLock { $0.fixed.append(value) }
    }

    public func redact(_ text: String) -> String {
        if let parent { return parent.redact(text) }
        let current = secrets.withLock { $0.tokens.values.flatMap { $0 } + $0.fixed }
        var result = text
        for secret in current where result.contains(secret) {
            result = result.replacing(secret, with: "[redacted]")
        }
        return result
    }
}
