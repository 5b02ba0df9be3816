import Foundation

/// When an access token expires and how early to replace it.
enum TokenExpiry {
    /// `exp` and `iat` of a JWT access token. Decoded, not verified: tokenrelay is not the resource
    /// server, it only wants to know when the token will stop working.
    static func jwtClaims(_ token: String) -> (expiresAt: Date, issuedAt: Date?)? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = base64URLDecode(parts[1]),
              let claims = try? JSONSerialization.jsonObject(with: payload) as? [String: Any],
              let exp = (claims["exp"] as? NSNumber)?.doubleValue else { return nil }
        let iat = (claims["iat"] as? NSNumber)?.doubleValue
        return (Date(timeIntervalSince1970: exp), iat.map(Date.init(timeIntervalSince1970:)))
    }

    private static func base64URLDecode(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }

    /// Expiry and lifetime of tokens just granted: `expires_in` first, then the JWT `exp` claim.
    static func forGrant(accessToken: String, expiresIn: Double?, now: Date) -> (expiresAt: Date?, lifetime: Double?) {
        if let expiresIn { return (now.addingTimeInterval(expiresIn), expiresIn) }
        if let claims = jwtClaims(accessToken) {
            let issued = claims.issuedAt ?? now
            return (claims.expiresAt, claims.expiresAt.timeIntervalSince(issued))
        }
        return (nil, nil)
    }

    /// Expiry and lifetime of tokens read from the token file: its `expires_at` first, then the JWT
    /// `exp` claim. Without an issue time the remaining time stands in for the lifetime.
    static func forStoredTokens(_ tokens: TokenSet, now: Date) -> (expiresAt: Date?, lifetime: Double?) {
        let claims = jwtClaims(tokens.accessToken)
        guard let expiresAt = tokens.expiresAt ?? claims?.expiresAt else { return (nil, nil) }
        if let issued = claims?.issuedAt, claims?.expiresAt == expiresAt { return (expiresAt, expiresAt.timeIntervalSince(issued)) }
        return (expiresAt, max(0, expiresAt.timeIntervalSince(now)))
    }

    /// How long before expiry to refresh: 10% of the lifetime within [1 s, 5 min] unless configured, and
    /// never more than half the lifetime. A skew longer than the lifetime is how a sidecar ends up
    /// refreshing in a tight loop: every new token would already be "due".
    static func skew(lifetime: Double, configured: Double?) -> Double {
        let wanted = configured ?? min(max(lifetime * 0.1, 1), 300)
        return max(0, min(wanted, lifetime / 2))
    }
}
