import FoundationEssentials
import JOSE

/// A private key loaded from its PEM file and checked against the algorithm it will sign with, ready to
/// sign JWTs (RFC 7519) for private_key_jwt and the jwt_bearer grant. Immutable: shared by the loop and the
/// helper threads that sign.
struct AssertionSigner: Sendable {
    let key: SigningKey
    let algorithm: JWSAlgorithm
    let keyID: String?
    /// `x5t#S256`: base64url of the SHA-256 of the certificate's DER bytes.
    var certificateThumbprint: String? = nil

    /// Reads and checks the key. Blocks on the file: `Preflight` calls it (at start, in `check`, and on a
    /// reload's helper thread). Every failure names the config field; none shows a byte of the key.
    static func load(_ settings: SignedAssertionSettings) throws -> AssertionSigner {
        let key: SigningKey
        do {
            key = try SigningKey.load(pemFile: settings.keyFile)
        } catch {
            let reason = "\(error)"
            throw ConfigError(settings.keyField, reason.contains(settings.keyFile) ? reason : "\(settings.keyFile): \(reason)")
        }
        let algorithm = settings.algorithm ?? key.defaultAlgorithm
        do {
            try key.check(algorithm)
        } catch {
            let field = settings.algorithm == nil ? settings.keyField : settings.algorithmField
            throw ConfigError(field, "\(settings.keyFile) cannot sign \(algorithm.rawValue): \(error)")
        }
        let thumbprint = try settings.certificateFile.map { try CertificateThumbprint.sha256(pemFile: $0, field: "refresh.client_key_certificate_file") }
        return AssertionSigner(key: key, algorithm: algorithm, keyID: settings.keyID, certificateThumbprint: thumbprint)
    }

    /// A compact JWS of `claims` with this key. A signing failure is an OpenSSL error on a key that
    /// signed at load time; it fails the one request, with the reason.
    func sign(claims: [String: Any]) throws(CredentialUnavailable) -> String {
        var header: [String: Any] = ["alg": algorithm.rawValue, "typ": "JWT"]
        if let keyID { header["kid"] = keyID }
        if let certificateThumbprint { header["x5t#S256"] = certificateThumbprint }
        do {
            let headerJSON = try JSONWriter.data(header, options: [.sortedKeys, .withoutEscapingSlashes])
            let payloadJSON = try JSONWriter.data(claims, options: [.sortedKeys, .withoutEscapingSlashes])
            return try JWS.compact(headerJSON: headerJSON, payloadJSON: payloadJSON, key: key, alg: algorithm)
        } catch {
            throw CredentialUnavailable(reason: "signing the assertion failed: \(error)")
        }
    }

    /// The registered claims of an assertion (RFC 7523 §3): who issues it about whom, for which audience,
    /// when, until when, and a `jti` never used before, so an IdP that remembers jtis accepts each once.
    static func claims(issuer: String, subject: String, audience: String, lifetimeSeconds: Int, now: Date) -> [String: Any] {
        let issuedAt = Int(now.timeIntervalSince1970.rounded(.down))
        return ["iss": issuer, "sub": subject, "aud": audience, "iat": issuedAt, "exp": issuedAt + lifetimeSeconds,
                "jti": SecureRandom.identifier()]
    }
}

/// The keys `refresh` needs, loaded by `Preflight` off the loop (at start, and on every reload, which is
/// how a replaced key file is taken up).
struct CredentialKeys: Sendable {
    /// private_key_jwt with `client_key_file`.
    var clientAssertion: AssertionSigner?
    /// jwt_bearer with `refresh.assertion.key_file`.
    var grantAssertion: AssertionSigner?

    static let none = CredentialKeys()

    /// What tells one set of keys from another without a byte of them: thumbprints, kids, algorithms.
    var identity: [String] {
        [clientAssertion, grantAssertion].map { signer in
            signer.map { "\($0.key.thumbprint) \($0.algorithm.rawValue) \($0.keyID ?? "") \($0.certificateThumbprint ?? "")" } ?? "none"
        }
    }

    static func load(_ settings: Config.Refresh) throws -> CredentialKeys {
        var keys = CredentialKeys()
        if settings.clientAuth == .privateKeyJWT, case .signed(let signing)? = settings.clientAssertion {
            keys.clientAssertion = try AssertionSigner.load(signing)
        }
        if settings.grant == .jwtBearer, case .signed(let signing, _, _, _, _)? = settings.assertion {
            keys.grantAssertion = try AssertionSigner.load(signing)
        }
        return keys
    }
}
