internal import CJOSECrypto

/// A private key that signs JWS (client assertions, jwt-bearer assertions, DPoP proofs).
/// Immutable after load and safe to share between threads: OpenSSL 3 allows concurrent signing with one
/// EVP_PKEY, and nothing here changes after init. Load it OFF the event loop (file read, parsing, RSA
/// generation all block); sign anywhere.
public final class SigningKey: @unchecked Sendable, CustomStringConvertible {
    let key: OpaquePointer
    public let kind: KeyKind
    /// canonical JSON (RFC 7638 member order, no whitespace) of the PUBLIC key only
    public let publicJWK: String
    /// RFC 7638 jkt: base64url(SHA-256(publicJWK)), no padding
    public let thumbprint: String

    private init(taking key: OpaquePointer) throws {
        self.key = key
        var bits: Int32 = 0
        switch jose_key_kind(key, &bits) {
        case Int32(JOSE_KEY_RSA.rawValue): kind = .rsa(bits: Int(bits))
        case Int32(JOSE_KEY_EC_P256.rawValue): kind = .ecP256
        case Int32(JOSE_KEY_EC_P384.rawValue): kind = .ecP384
        case Int32(JOSE_KEY_ED25519.rawValue): kind = .ed25519
        default:
            jose_key_free(key)
            throw JOSEError("unsupported key type (expected RSA, EC P-256, EC P-384 or Ed25519)")
        }
        guard let jwk = SigningKey.publicJWK(of: key, kind: kind) else {
            jose_key_free(key)
            throw JOSEError("cannot export the public key")
        }
        publicJWK = jwk
        thumbprint = JWK.thumbprint(jwk)
    }

    /// Safe for a log line: the kind and the public thumbprint, nothing private.
    public var description: String { "\(kind) (jkt \(thumbprint))" }

    deinit {
        jose_key_free(key)
    }

    /// blocking file read: call OFF the loop
    public static func load(pemFile path: String) throws -> SigningKey {
        var pem = try KeyFile.read(path)
        defer { pem.withUnsafeMutableBufferPointer { $0.update(repeating: 0) } }   // the key in clear, gone once parsed
        return try load(pem: pem)
    }

    public static func load(pem: [UInt8]) throws -> SigningKey {
        var reason: UnsafePointer<CChar>? = nil
        let loaded = pem.withUnsafeBufferPointer { jose_key_from_pem($0.baseAddress, $0.count, &reason) }
        guard let loaded else { throw JOSEError(reason.map { String(cString: $0) } ?? "cannot load the key") }
        return try SigningKey(taking: loaded)
    }

    /// RSA: 2048 bits
    public static func generate(for alg: JWSAlgorithm) throws -> SigningKey {
        let kind = switch alg {
        case .ES256: JOSE_KEY_EC_P256
        case .ES384: JOSE_KEY_EC_P384
        case .EdDSA: JOSE_KEY_ED25519
        case .RS256, .PS256: JOSE_KEY_RSA
        }
        var reason: UnsafePointer<CChar>? = nil
        guard let generated = jose_key_generate(Int32(kind.rawValue), 2048, &reason) else {
            throw JOSEError(reason.map { String(cString: $0) } ?? "key generation failed")
        }
        return try SigningKey(taking: generated)
    }

    /// RSA→RS256, P-256→ES256, P-384→ES384, Ed25519→EdDSA
    public var defaultAlgorithm: JWSAlgorithm {
        switch kind {
        case .rsa: .RS256
        case .ecP256: .ES256
        case .ecP384: .ES384
        case .ed25519: .EdDSA
        }
    }

    /// wrong type / RSA < 2048 → JOSEError("… needs …")
    public func check(_ alg: JWSAlgorithm) throws {
        switch (alg, kind) {
        case (.ES256, .ecP256), (.ES384, .ecP384), (.EdDSA, .ed25519): return
        case (.RS256, .rsa(let bits)), (.PS256, .rsa(let bits)):
            if bits >= 2048 { return }
            throw JOSEError("\(alg.rawValue) needs an RSA key of at least 2048 bits, not \(kind)")
        case (.ES256, _): throw JOSEError("ES256 needs an EC P-256 key, not \(kind)")
        case (.ES384, _): throw JOSEError("ES384 needs an EC P-384 key, not \(kind)")
        case (.EdDSA, _): throw JOSEError("EdDSA needs an Ed25519 key, not \(kind)")
        case (.RS256, _), (.PS256, _): throw JOSEError("\(alg.rawValue) needs an RSA key of at least 2048 bits, not \(kind)")
        }
    }

    /// JWS signature bytes (raw r||s for EC)
    public func sign(_ message: [UInt8], alg: JWSAlgorithm) throws -> [UInt8] {
        try check(alg)
        let cAlg = switch alg {
        case .ES256: JOSE_ALG_ES256
        case .ES384: JOSE_ALG_ES384
        case .EdDSA: JOSE_ALG_EDDSA
        case .RS256: JOSE_ALG_RS256
        case .PS256: JOSE_ALG_PS256
        }
        var signature = [UInt8](repeating: 0, count: max(jose_signature_capacity(key), 132))
        var count = signature.count
        var reason: UnsafePointer<CChar>? = nil
        let ok = message.withUnsafeBufferPointer { message in
            signature.withUnsafeMutableBufferPointer { out in
                jose_sign(key, Int32(cAlg.rawValue), message.baseAddress, message.count, out.baseAddress, &count, &reason)
            }
        }
        guard ok == 1 else { throw JOSEError(reason.map { String(cString: $0) } ?? "signing failed") }
        return Array(signature[0..<count])
    }

    /// PKCS#8 PEM, to persist a generated key (sealed when configured)
    public func privateKeyPEM() throws -> [UInt8] {
        var bytes: UnsafeMutablePointer<UInt8>? = nil
        var count = 0
        guard jose_private_key_pem(key, &bytes, &count) == 1, let bytes else { throw JOSEError("cannot export the private key") }
        defer { jose_bytes_free(bytes, count) }
        return Array(UnsafeBufferPointer(start: bytes, count: count))
    }

    private static func publicJWK(of key: OpaquePointer, kind: KeyKind) -> String? {
        func component(_ index: Int32) -> String? {
            var buffer = [UInt8](repeating: 0, count: 2048)
            var count = buffer.count
            let ok = buffer.withUnsafeMutableBufferPointer { jose_public_component(key, index, $0.baseAddress, &count) }
            return ok == 1 ? Base64URL.encode(Array(buffer[0..<count])) : nil
        }
        switch kind {
        case .rsa:
            guard let n = component(0), let e = component(1) else { return nil }
            return JWK.rsa(n: n, e: e)
        case .ecP256, .ecP384:
            guard let x = component(0), let y = component(1) else { return nil }
            return JWK.ec(curve: kind == .ecP256 ? "P-256" : "P-384", x: x, y: y)
        case .ed25519:
            guard let x = component(0) else { return nil }
            return JWK.okp(curve: "Ed25519", x: x)
        }
    }
}
