import FoundationEssentials

/// Tokens granted by one successful refresh.
struct TokenGrant {
    var accessToken: String
    /// Present when the server rotated the refresh token; the old one is burnt from this moment.
    var refreshToken: String?
    var expiresIn: Double?
    /// Parts of the answer that were ignored or clamped (an `expires_in` that is not a positive number,
    /// or one beyond `TokenExpiry.longestLifetime`), for the log.
    var warnings: [String] = []
    /// `token_type: DPoP`: the tokens are bound to the proof key (RFC 9449 §5); usable only with `dpop`.
    var proofBound = false
    /// The key the tokens are bound to (its RFC 7638 thumbprint), set by the client that signed the proof.
    var boundKeyThumbprint: String?

    /// Without a lifetime in the answer the JWT `exp` is used: say so when it is clamped.
    mutating func noteClampedJWTExpiry(now: Date) {
        if expiresIn == nil, let warning = TokenExpiry.jwtClampWarning(accessToken, now: now) { warnings.append(warning) }
    }
}

extension TokenSet {
    /// These tokens after `grant`, with the expiry tokenrelay plans with and the token's lifetime.
    func renewed(by grant: TokenGrant, now: Date) -> (tokens: TokenSet, lifetime: Double?) {
        var next = self
        next.accessToken = grant.accessToken
        // RFC 6749 §6: without a new refresh token in the response, the old one stays valid.
        if let refresh = grant.refreshToken { next.refreshToken = refresh }
        // Which key the stored tokens are bound to: a start with another key asks for a new login instead of
        // presenting a bound refresh token with the wrong key.
        if let jkt = grant.boundKeyThumbprint { next.otherFields[TokenSet.dpopThumbprintField] = jkt } else { next.otherFields[TokenSet.dpopThumbprintField] = nil }
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
    /// neither "login required" nor transient). `rotation` says what became of the refresh token.
    case invalidResponse(reason: String, rotation: Rotation)
    /// No request could be built from the stored tokens and credentials (no refresh token, or a value
    /// that cannot go where the template puts it). Nothing was sent; only new tokens can help.
    case unusable(reason: String)

    /// What an unusable answer did to the refresh token. A 2xx may well have rotated it even if the access
    /// token is unusable; presenting the old one again would then look like theft to the server.
    enum Rotation: Equatable {
        /// Nothing was rotated: a non-2xx answer, or a 2xx without a refresh token (RFC 6749 §6: the old
        /// one stays valid).
        case none
        /// A usable new refresh token: keep it, the old one is burnt.
        case rotated(to: String)
        /// A 2xx whose refresh token could not be read: the old one may be burnt.
        case unknown
    }

    /// Classifies a complete HTTP response from the token endpoint (RFC 6749 §5.1, §5.2).
    static func classify(status: Int, body: [UInt8]) -> TokenEndpointResult {
        let json = TokenEndpointJSON.parse(body) as? [String: Any]
        switch status {
        case 200..<300:
            guard let json else { return .invalidResponse(reason: "response body is not a JSON object", rotation: .unknown) }
            return parseGrant(json)
        case 408, 425, 429, 500..<600:
            return .transient(reason: "token endpoint answered \(status)", outcomeUnknown: false)
        case 300..<400:
            // Not a refusal of the refresh token: the request went to the wrong place (a moved endpoint,
            // http sent to https). Latching "login required" would send the operator to log in again,
            // which cannot help; the cycle fails with the cause and the next one tries again.
            return .invalidResponse(reason: "token endpoint answered \(status), a redirect (not followed: check refresh.token_url)",
                                    rotation: .none)
        default:
            // Only the error code is kept, sanitised: descriptions are free text and could echo a token.
            let code = (json?["error"] as? String).map(OAuthErrorCode.sanitized)
            return .rejected(status: status, oauthError: code)
        }
    }

    static let dpopNotConfigured = "token_type DPoP needs a proof with every request: add a \"dpop\" block to the config (tokenrelay then signs them)"

    private static func parseGrant(_ json: [String: Any]) -> TokenEndpointResult {
        var rotation = Rotation.none
        if let refresh = json["refresh_token"], !(refresh is JSONNull) {
            guard let refresh = refresh as? String, TokenSet.unusableReason(refresh) == nil else {
                return .invalidResponse(reason: "refresh_token is not a usable string (visible ASCII, at most \(TokenSet.maximumTokenBytes) bytes)",
                                        rotation: .unknown)
            }
            rotation = .rotated(to: refresh)
        }
        guard let access = json["access_token"] as? String, !access.isEmpty else {
            return .invalidResponse(reason: "response has no access_token", rotation: rotation)
        }
        if let reason = TokenSet.unusableReason(access) {
            return .invalidResponse(reason: "access_token \(reason)", rotation: rotation)
        }
        // RFC 6749 §7.1: a client must not use a token whose type it does not understand. Bearer goes in a
        // header as is; DPoP needs a proof per request (usable with `dpop`, which the client checks); MAC
        // tokens are not supported.
        var proofBound = false
        if let type = json["token_type"] as? String {
            if type.lowercased() == "mac" {
                return .invalidResponse(reason: "token_type MAC needs proof of possession, which tokenrelay does not do", rotation: rotation)
            }
            proofBound = type.lowercased() == "dpop"
        }
        var grant = TokenGrant(accessToken: access)
        grant.proofBound = proofBound
        if case .rotated(let refresh) = rotation { grant.refreshToken = refresh }
        grant.expiresIn = expiresIn(json["expires_in"], field: "expires_in", warnings: &grant.warnings)
        grant.noteClampedJWTExpiry(now: Date())
        return .granted(grant)
    }

    /// A token lifetime, or nil (with a warning) when the value is not a positive number of seconds: the
    /// tokens are still good, and a lifetime of 0 would make every new token due at once.
    static func expiresIn(_ value: Any?, field: String, warnings: inout [String]) -> Double? {
        guard let value, !(value is JSONNull) else { return nil }
        guard let seconds = Timestamp.seconds(value), seconds > 0 else {
            warnings.append("ignored \(field): not a positive number of seconds")
            return nil
        }
        return clampedLifetime(seconds, field: field, warnings: &warnings)
    }

    /// A lifetime from the answer, clamped to `TokenExpiry.longestLifetime` (with a warning when it was).
    static func clampedLifetime(_ seconds: Double, field: String, warnings: inout [String]) -> Double {
        let clamped = TokenExpiry.clampedLifetime(seconds)
        if clamped != seconds {
            warnings.append("clamped \(field): more than \(TokenExpiry.longestLifetimeDescription); planning with \(TokenExpiry.longestLifetimeDescription)")
        }
        return clamped
    }
}
