import HTTPTransport

/// A short, one-way name for a token: the first 12 hex digits of its SHA-256. Enough to tell two tokens
/// apart (or match one with the identity provider's records) without revealing anything usable.
enum TokenFingerprint {
    static func of(_ token: String) -> String {
        let digest = SHA256Digest.of(Array(token.utf8))
        return "sha256:" + digest.prefix(6).map { cFormat("%02x", $0) }.joined()
    }
}
