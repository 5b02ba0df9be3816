import FoundationEssentials

/// private_key_jwt with `client_key_file` (RFC 7523 §2.2, OpenID Connect Core §9): a client assertion
/// signed here for every token request — iss = sub = client_id, the configured audience, a fresh `jti`,
/// and a short life — sent with `client_id`. No secret exists or is read.
struct PrivateKeyJWTCredential: ClientCredentialSource {
    /// Long enough for a slow token endpoint and some clock skew, short enough that a captured assertion
    /// is soon worthless (IdPs accept at most a few minutes).
    static let lifetimeSeconds = 120

    let clientID: String
    let signer: AssertionSigner
    let audience: String

    /// A signature costs from tens of microseconds (Ed25519, ECDSA) to a millisecond or more (RSA).
    var blocks: Bool { true }

    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields {
        let claims = AssertionSigner.claims(issuer: clientID, subject: clientID, audience: audience,
                                            lifetimeSeconds: Self.lifetimeSeconds, now: Date())
        return ClientAuthenticationFields(fields: ClientAssertionFields.make(clientID: clientID, assertion: try signer.sign(claims: claims)))
    }
}

/// RFC 7521 §4.2: how a client assertion travels in the form.
enum ClientAssertionFields {
    static let jwtBearerType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

    static func make(clientID: String, assertion: String) -> [(String, String)] {
        [("client_id", clientID), ("client_assertion_type", jwtBearerType), ("client_assertion", assertion)]
    }
}
