import Foundation

/// Tokens granted by one successful refresh.
struct TokenGrant {
    var accessToken: String
    /// Present when the server rotated the refresh token; the old one is burnt from this moment.
    var refreshToken: String?
    var expiresIn: Double?
}

extension TokenSet {
    /// These tokens after `grant`, with the expiry tokenrelay plans with and the token's lifetime.
    func renewed(by grant: TokenGrant, now: Date) -> (tokens: TokenSet, lifetime: Double?) {
        var next = self
        next.accessToken = grant.accessToken
        // RFC 6749 §6: without a new refresh token in the response, the old one stays valid.
        if let refresh = grant.refreshToken { next.refreshToken = refresh }
        let expiry = TokenExpiry.forGrant(accessToken: grant.accessToken, expiresIn: grant.expiresIn, now: now)
        next.expiresAt = expiry.expiresAt
        return (next, expiry.lifetime)
    }
}

/// How one exchange with the token endpoint ended, classified by what tokenrelay must do next.
enum TokenEndpointResult {
    case granted(TokenGrant)
    /// The server refused the refresh token or the client (400 `invalid_grant`, 401, other 4xx):
    /// trying again cannot help, a new login is needed.
    case rejected(status: Int, oauthError: String?)
    /// Connect error, timeout, 5xx, 429: worth retrying. `outcomeUnknown` means the request may have
    /// reached the server, which may have rotated the refresh token without us seeing the answer.
    case transient(reason: String, outcomeUnknown: Bool)
    /// The server answered 2xx but not with usable tokens (or, for the custom grant, a status that is
    /// neither "login required" nor transient).
    case invalidResponse(reason: String)
    /// No request could be built from the stored tokens and credentials (no refresh token, or a value
    /// that cannot go where the template puts it). Nothing was sent; only new tokens can help.
    case unusable(reason: String)

    /// Classifies a complete HTTP response from the token endpoint (RFC 6749 §5.1, §5.2).
    static func classify(status: Int, body: [UInt8]) -> TokenEndpointResult {
        let json = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any]
        switch status {
        case 200..<300:
            guard let json else { return .invalidResponse(reason: "response body is not a JSON object") }
            return parseGrant(json)
        case 408, 425, 429, 500..<600:
            return .transient(reason: "token endpoint answered \(status)", outcomeUnknown: false)
        default:
            // Only the error code is kept, sanitised: descriptions are free text and could echo a token.
            let code = (json?["error"] as? String).map(OAuthErrorCode.sanitized)
            return .rejected(status: status, oauthError: code)
        }
    }

    private static func parseGrant(_ json: [String: Any]) -> TokenEndpointResult {
        guard let access = json["access_token"] as? String, !access.isEmpty else {
            return .invalidResponse(reason: "response has no access_token")
        }
        guard TokenSet.isHeaderSafe(access) else {
            return .invalidResponse(reason: "access_token contains characters not allowed in an HTTP header")
        }
        var grant = TokenGrant(accessToken: access)
        if let refresh = json["refresh_token"], !(refresh is NSNull) {
            guard let refresh = refresh as? String, TokenSet.isHeaderSafe(refresh) else {
                return .invalidResponse(reason: "refresh_token is not a usable string")
            }
            grant.refreshToken = refresh
        }
        if let expires = json["expires_in"], !(expires is NSNull) {
            guard let seconds = Timestamp.seconds(expires), seconds >= 0 else {
                return .invalidResponse(reason: "expires_in is not a number of seconds")
            }
            grant.expiresIn = seconds
        }
        return .granted(grant)
    }
}
