import FoundationEssentials

/// When an access token expires and how early to replace it.
enum TokenExpiry {
    /// The longest tokenrelay plans ahead. Every time and duration from outside (a token endpoint's
    /// `expires_in` or `expires_at`, a JWT's `exp` and `iat`, the token file's `expires_at`) is clamped
    /// to at most this far from now where it is read: `"expires_in": 1e19` is valid JSON, and turning
    /// it into a timer must not trap (a crash would lose every held request, and a token file holding
    /// such a token would crash every start). A token that really lives longer is merely refreshed early.
    static let longestLifetime: Double = 366 * 86_400
    static let longestLifetimeDescription = "366 days"

    /// A duration from outside, within [0, `longestLifetime`].
    static func clampedLifetime(_ seconds: Double) -> Double {
        guard seconds.isFinite else { return seconds > 0 ? longestLifetime : 0 }
        return min(max(seconds, 0), longestLifetime)
    }

    /// A point in time from outside, at most `longestLifetime` after `now`.
    static func clampedDate(_ date: Date, now: Date) -> Date {
        min(date, now.addingTimeInterval(longestLifetime))
    }

    /// Whether `date` lies further ahead than tokenrelay plans (the value was or will be clamped).
    static func isBeyondPlanning(_ date: Date, now: Date) -> Bool {
        date.timeIntervalSince(now) > longestLifetime
    }

    /// `exp` and `iat` of a JWT access token, clamped to `longestLifetime` from `now`. Decoded, not
    /// verified: tokenrelay is not the resource server, it only wants to know when the token will stop
    /// working.
    static func jwtClaims(_ token: String, now: Date) -> (expiresAt: Date, issuedAt: Date?)? {
        guard let raw = rawJWTClaims(token) else { return nil }
        let expiresAt = clampedDate(raw.expiresAt, now: now)
        return (expiresAt, raw.issuedAt.map { min(clampedDate($0, now: now), expiresAt) })
    }

    private static func rawJWTClaims(_ token: String) -> (expiresAt: Date, issuedAt: Date?)? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = base64URLDecode(parts[1]),
              let claims = (try? JSONReader.parse(payload)) as? [String: Any],
              let exp = (claims["exp"] as? JSONNumber)?.doubleValue, exp.isFinite else { return nil }
        let iat = (claims["iat"] as? JSONNumber).map(\.doubleValue).flatMap { $0.isFinite ? $0 : nil }
        return (Date(timeIntervalSince1970: exp), iat.map(Date.init(timeIntervalSince1970:)))
    }

    /// A warning when the expiry tokenrelay would read for these tokens (the file's `expires_at`, else
    /// the JWT `exp`) lies beyond `longestLifetime` and is therefore clamped; nil otherwise.
    static func clampWarning(for tokens: TokenSet, now: Date) -> String? {
        if let expiresAt = tokens.expiresAt {
            return isBeyondPlanning(expiresAt, now: now) ? "expires_at is more than \(longestLifetimeDescription) away; planning with \(longestLifetimeDescription)" : nil
        }
        return jwtClampWarning(tokens.accessToken, now: now)
    }

    /// A warning when the access token is a JWT whose `exp` lies beyond `longestLifetime`.
    static func jwtClampWarning(_ accessToken: String, now: Date) -> String? {
        guard let raw = rawJWTClaims(accessToken), isBeyondPlanning(raw.expiresAt, now: now) else { return nil }
        return "the access token's JWT exp is more than \(longestLifetimeDescription) away; planning with \(longestLifetimeDescription)"
    }

    private static func base64URLDecode(_ text: Substring) -> Data? {
        var base64 = String(text).replacing("-", with: "+").replacing("_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }

    /// Expiry and lifetime of tokens just granted: `expires_in` first, then the JWT `exp` claim.
    static func forGrant(accessToken: String, expiresIn: Double?, now: Date) -> (expiresAt: Date?, lifetime: Double?) {
        if let expiresIn {
            let lifetime = clampedLifetime(expiresIn)
            return (now.addingTimeInterval(lifetime), lifetime)
        }
        if let claims = jwtClaims(accessToken, now: now) {
            let issued = claims.issuedAt ?? now
            return (claims.expiresAt, claims.expiresAt.timeIntervalSince(issued))
        }
        return (nil, nil)
    }

    /// Expiry and lifetime of tokens read from the token file: its `expires_at` first, then the JWT
    /// `exp` claim. Without an issue time the remaining time stands in for the lifetime.
    static func forStoredTokens(_ tokens: TokenSet, now: Date) -> (expiresAt: Date?, lifetime: Double?) {
        let claims = jwtClaims(tokens.accessToken, now: now)
        guard let expiresAt = tokens.expiresAt.map({ clampedDate($0, now: now) }) ?? claims?.expiresAt else { return (nil, nil) }
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
