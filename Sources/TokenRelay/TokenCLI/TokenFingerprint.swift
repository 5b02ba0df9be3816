import CEventShim

/// A short, one-way name for a token: the first 12 hex digits of its SHA-256. Enough to tell two tokens
/// apart (or match one with the identity provider's records) without revealing anything usable.
enum TokenFingerprint {
    static func of(_ token: String) -> String {
        var digest = [UInt8](repeating: 0, count: 32)
        let bytes = Array(token.utf8)
        // libcrypto is linked already (TLS); no extra package for one hash. Not SHA256(): see the shim.
        _ = tr_sha256(bytes, bytes.count, &digest)
        return "sha256:" + digest.prefix(6).map { cFormat("%02x", $0) }.joined()
    }
}
