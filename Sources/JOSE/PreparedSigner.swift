internal import CJOSECrypto

/// Signs many messages with one key and algorithm, cheaper than `SigningKey.sign` per call: the OpenSSL
/// context is initialised once (its digest and signature implementations fetched, the key bound) and each
/// signature runs on a copy of it. Every signature still draws its own ECDSA nonce; nothing random is
/// prepared ahead. NOT thread-safe: one owner (the event loop) signs with it at a time.
public final class PreparedSigner {
    public let key: SigningKey
    public let alg: JWSAlgorithm
    private let prepared: OpaquePointer
    private var buffer: [UInt8]

    public init(key: SigningKey, alg: JWSAlgorithm) throws {
        try key.check(alg)
        var reason: UnsafePointer<CChar>? = nil
        guard let prepared = jose_prepared_new(key.key, Int32(alg.cAlgorithm), &reason) else {
            throw JOSEError(reason.map { String(cString: $0) } ?? "cannot prepare signing")
        }
        self.key = key
        self.alg = alg
        self.prepared = prepared
        buffer = [UInt8](repeating: 0, count: max(jose_signature_capacity(key.key), 132))
    }

    deinit {
        jose_prepared_free(prepared)
    }

    /// The JWS signature of `message` (raw r||s for ECDSA), as `SigningKey.sign` makes it.
    public func sign(_ message: [UInt8]) throws -> [UInt8] {
        var count = buffer.count
        var reason: UnsafePointer<CChar>? = nil
        let ok = message.withUnsafeBufferPointer { message in
            buffer.withUnsafeMutableBufferPointer { out in
                jose_prepared_sign(prepared, message.baseAddress, message.count, out.baseAddress, &count, &reason)
            }
        }
        guard ok == 1 else { throw JOSEError(reason.map { String(cString: $0) } ?? "signing failed") }
        return Array(buffer[0..<count])
    }
}

extension JWSAlgorithm {
    var cAlgorithm: UInt32 {
        switch self {
        case .ES256: JOSE_ALG_ES256.rawValue
        case .ES384: JOSE_ALG_ES384.rawValue
        case .EdDSA: JOSE_ALG_EDDSA.rawValue
        case .RS256: JOSE_ALG_RS256.rawValue
        case .PS256: JOSE_ALG_PS256.rawValue
        }
    }
}
