/// A JOSE failure as one line of English: the cause (a file's problem, a key that cannot sign with an
/// algorithm, a tag that does not match). Never carries key material, signatures or plaintext, so a caller
/// may log it or put it in a `check` error after the name of its field.
public struct JOSEError: Error, CustomStringConvertible, Equatable, Sendable {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

/// The JWS algorithms tokenrelay signs with (RFC 7518 §3, RFC 8037 for EdDSA with Ed25519).
public enum JWSAlgorithm: String, Sendable, CaseIterable {
    case ES256, ES384, EdDSA, RS256, PS256
}

/// The private key types tokenrelay accepts.
public enum KeyKind: Sendable, Equatable, CustomStringConvertible {
    case rsa(bits: Int), ecP256, ecP384, ed25519

    public var description: String {
        switch self {
        case .rsa(let bits): "an RSA \(bits)-bit key"
        case .ecP256: "an EC P-256 key"
        case .ecP384: "an EC P-384 key"
        case .ed25519: "an Ed25519 key"
        }
    }
}
