import JOSE

/// A JWT tokenrelay signs itself: the key (loaded at start and on reload, never per request), its `kid`,
/// the algorithm and the audience. Shared by private_key_jwt's client assertion and the jwt_bearer grant.
public struct SignedAssertionSettings: Sendable, Equatable {
    public var keyFile: String
    /// Where `keyFile` sits in the config (`refresh.client_key_file`, `refresh.assertion.key_file`), for errors.
    public var keyField: String
    public var keyID: String?
    /// The key's X.509 certificate (`refresh.client_key_certificate_file`): its SHA-256 thumbprint goes into
    /// the header as `x5t#S256`, which is how Microsoft Entra ID finds a certificate credential.
    public var certificateFile: String?
    /// nil: the key's own default (RSA → RS256, P-256 → ES256, P-384 → ES384, Ed25519 → EdDSA).
    public var algorithm: JWSAlgorithm?
    public var algorithmField: String
    public var audience: String
}

/// `refresh.client_auth: private_key_jwt`: the client assertion is signed here, or read ready-made from
/// `client_assertion_file` for every token request (a projected service-account token the kubelet rotates).
public enum ClientAssertionSource: Sendable, Equatable {
    case signed(SignedAssertionSettings)
    case file(String)
}

/// `refresh.assertion` of the jwt_bearer grant.
public enum AssertionGrantSettings: Sendable, Equatable {
    /// Signed here for every token request.
    case signed(SignedAssertionSettings, issuer: String, subject: String, lifetimeSeconds: Int, extraClaims: ExtraClaims)
    /// `refresh.assertion.file`: ready-made, read afresh for every token request.
    case file(String)
}

/// `refresh.assertion.claims`: further claims as configured, kept as the JSON text of one object so the
/// settings stay a plain value.
public struct ExtraClaims: Sendable, Equatable {
    public let json: String
    public static let none = ExtraClaims(json: "{}")

    /// The claims as a tree, to be merged with the ones tokenrelay sets.
    var members: [String: Any] {
        ((try? JSONReader.parse(Array(json.utf8))) as? [String: Any]) ?? [:]
    }
}

/// `refresh.grant: token_exchange` (RFC 8693 §2.1).
public struct TokenExchangeSettings: Sendable, Equatable {
    public static let jwtTokenType = "urn:ietf:params:oauth:token-type:jwt"

    public var subjectTokenFile: String
    public var subjectTokenType = jwtTokenType
    public var actorTokenFile: String?
    public var actorTokenType: String?
    public var requestedTokenType: String?
}
