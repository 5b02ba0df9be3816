import CTransportSocket

/// SHA-256 from the OpenSSL the transport links for TLS: no extra package for one hash.
public enum SHA256Digest {
    /// The 32-byte digest of `bytes`.
    public static func of(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 32)
        let succeeded = transport_sha256(bytes, bytes.count, &digest) == 1
        // Only an allocation failure inside OpenSSL could fail it; an all-zero digest then names nothing.
        return succeeded ? digest : [UInt8](repeating: 0, count: 32)
    }
}
