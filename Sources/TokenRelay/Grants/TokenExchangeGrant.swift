/// OAuth 2.0 Token Exchange (RFC 8693 §2.1): a subject token someone else keeps current in a file (a
/// projected Kubernetes service-account token), optionally an actor token, exchanged for an access token.
/// Both files are read afresh for every exchange. No refresh token: like client_credentials, a new access
/// token is asked for ahead of expiry and on a refresh-triggering 401.
struct TokenExchangeGrant: TokenGrantStrategy {
    static let grantType = "urn:ietf:params:oauth:grant-type:token-exchange"

    let settings: Config.Refresh
    let exchange: TokenExchangeSettings
    let client: any ClientCredentialSource

    var needsRefreshToken: Bool { false }
    var blocksWhileMakingRequest: Bool { true }

    func makeRequest(for tokens: TokenRequestInput) -> Result<TokenHTTPRequest, UnusableRequest> {
        do {
            var fields = [("grant_type", Self.grantType),
                          ("subject_token", try Self.read(exchange.subjectTokenFile, type: exchange.subjectTokenType, field: "refresh.subject_token_file")),
                          ("subject_token_type", exchange.subjectTokenType)]
            if let actorFile = exchange.actorTokenFile, let actorType = exchange.actorTokenType {
                fields.append(("actor_token", try Self.read(actorFile, type: actorType, field: "refresh.actor_token_file")))
                fields.append(("actor_token_type", actorType))
            }
            if let resource = settings.resource { fields.append(("resource", resource)) }
            if let audience = settings.audience { fields.append(("audience", audience)) }
            if let scope = settings.scope { fields.append(("scope", scope)) }
            if let requested = exchange.requestedTokenType { fields.append(("requested_token_type", requested)) }
            return .success(try .oauthForm(to: settings.tokenURL, fields: fields, client: client))
        } catch {
            return .failure(.credential(error))
        }
    }

    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult {
        TokenEndpointResult.classify(status: status, body: body)
    }

    /// A token typed as a JWT (or an ID token, which is one) must be one and unexpired; any other type
    /// (an opaque access token, a SAML assertion) is taken as the file holds it.
    private static func read(_ path: String, type: String, field: String) throws(CredentialUnavailable) -> String {
        let jwtTypes: Set = [TokenExchangeSettings.jwtTokenType, "urn:ietf:params:oauth:token-type:id_token"]
        return jwtTypes.contains(type) ? try CredentialFile.jwt(at: path, field: field) : try CredentialFile.text(at: path, field: field)
    }
}
