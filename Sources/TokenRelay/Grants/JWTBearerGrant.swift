import FoundationEssentials

/// The JWT bearer grant (RFC 7523 §2.1), as service accounts use it: a JWT signed with the account's key
/// (or a ready-made one from a file) is the grant. No refresh token: like client_credentials, a new
/// access token is asked for ahead of expiry and on a refresh-triggering 401.
struct JWTBearerGrant: TokenGrantStrategy {
    static let grantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"

    let settings: Config.Refresh
    let assertion: JWTBearerAssertion
    let client: any ClientCredentialSource

    var needsRefreshToken: Bool { false }
    /// Signing or reading the assertion file, every time.
    var blocksWhileMakingRequest: Bool { true }

    func makeRequest(for tokens: TokenRequestInput) -> Result<TokenHTTPRequest, UnusableRequest> {
        do {
            var fields = [("grant_type", Self.grantType), ("assertion", try assertion.produce())]
            if let scope = settings.scope { fields.append(("scope", scope)) }
            return .success(try .oauthForm(to: settings.tokenURL, fields: fields, client: client))
        } catch {
            return .failure(.credential(error))
        }
    }

    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult {
        TokenEndpointResult.classify(status: status, body: body)
    }
}

/// Where the jwt_bearer grant's assertion comes from for each request.
enum JWTBearerAssertion: Sendable {
    case signed(AssertionSigner, issuer: String, subject: String, audience: String, lifetimeSeconds: Int, extraClaims: ExtraClaims)
    case file(String)
    /// Settings and keys out of step (a programming error): every request fails with the reason.
    case unavailable(String)

    static func make(_ settings: AssertionGrantSettings?, signer: AssertionSigner?) -> JWTBearerAssertion {
        switch settings {
        case .signed(let signing, let issuer, let subject, let lifetime, let claims)?:
            guard let signer else { return .unavailable("\(signing.keyField): no key loaded") }
            return .signed(signer, issuer: issuer, subject: subject, audience: signing.audience, lifetimeSeconds: lifetime, extraClaims: claims)
        case .file(let path)?: return .file(path)
        case nil: return .unavailable("refresh.assertion: not configured")
        }
    }

    /// A new assertion (fresh `iat`, `exp` and `jti`), or the file's current one.
    func produce() throws(CredentialUnavailable) -> String {
        switch self {
        case .signed(let signer, let issuer, let subject, let audience, let lifetime, let extraClaims):
            // The configured extra claims first: the registered ones are tokenrelay's (the config refuses them).
            let claims = extraClaims.members.merging(
                AssertionSigner.claims(issuer: issuer, subject: subject, audience: audience, lifetimeSeconds: lifetime, now: Date())) { _, own in own }
            return try signer.sign(claims: claims)
        case .file(let path):
            return try CredentialFile.jwt(at: path, field: "refresh.assertion.file")
        case .unavailable(let reason):
            throw CredentialUnavailable(reason: reason)
        }
    }
}
