internal import CJOSECrypto

/// SHA-256 through OpenSSL's EVP (its first use loads OpenSSL's default provider: call it only from a
/// configured feature, never at start).
public enum Digest {
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        let ok = bytes.withUnsafeBufferPointer { input in
            digest.withUnsafeMutableBufferPointer { jose_sha256(input.baseAddress, input.count, $0.baseAddress) }
        }
        // Only an allocation failure inside OpenSSL fails a digest of bytes in memory.
        precondition(ok == 1, "SHA-256 failed inside OpenSSL")
        return digest
    }
}

/// OpenSSL's CSPRNG (RAND_bytes).
public enum SecureRandom {
    /// Traps only if the CSPRNG itself fails: a nonce or jti from a failed generator must never be used.
    public static func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: max(0, count))
        let ok = out.withUnsafeMutableBufferPointer { jose_random($0.baseAddress, $0.count) }
        precondition(ok == 1, "OpenSSL's random generator failed")
        return out
    }

    /// 128 random bits, base64url: for jti
    public static func identifier() -> String {
        Base64URL.encode(bytes(16))
    }
}

/// Whether OpenSSL's per-thread error queue is empty: every failing call here must leave it so, or the next
/// TLS call on the same thread (the event loop's) would read our stale error through SSL_get_error.
enum OpenSSLErrorQueue {
    static var isEmpty: Bool { jose_errors_pending() == 0 }
}
