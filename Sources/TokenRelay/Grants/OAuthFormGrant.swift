import FoundationEssentials
import HTTPTransport

/// The two form-encoded OAuth 2.0 grants: refresh_token (RFC 6749 §6) and client_credentials (§4.4),
/// with client authentication exactly as configured (never guessed, never switched between attempts).
struct OAuthFormGrant: TokenGrantStrategy {
    enum Kind { case refreshToken, clientCredentials }

    let kind: Kind
    let settings: Config.Refresh
    let client: any ClientCredentialSource

    var needsRefreshToken: Bool { kind == .refreshToken }
    var blocksWhileMakingRequest: Bool { client.blocks }

    func makeRequest(for current: TokenRequestInput) -> Result<TokenHTTPRequest, UnusableRequest> {
        var fields: [(String, String)]
        switch kind {
        case .refreshToken:
            guard let refreshToken = current.refreshToken else { return .failure(UnusableRequest(reason: "no refresh token")) }
            fields = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        case .clientCredentials:
            fields = [("grant_type", "client_credentials")]
        }
        if let scope = settings.scope { fields.append(("scope", scope)) }
        if let audience = settings.audience { fields.append(("audience", audience)) }
        if let resource = settings.resource { fields.append(("resource", resource)) }
        do {
            return .success(try .oauthForm(to: settings.tokenURL, fields: fields, client: client))
        } catch {
            return .failure(.credential(error))
        }
    }

    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult {
        TokenEndpointResult.classify(status: status, body: body)
    }
}

/// application/x-www-form-urlencoded, by the transport's encoder (everything but RFC 3986 unreserved
/// characters is percent-encoded).
enum FormEncoding {
    static func escape(_ value: String) -> String {
        PercentEncoding.encode(value)
    }

    static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }
}
