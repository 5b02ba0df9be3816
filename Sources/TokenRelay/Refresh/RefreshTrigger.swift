
/// Decides whether an upstream response says "this access token is no longer accepted", which a
/// refresh can fix, as opposed to "this token may not do that", which it cannot (RFC 6750 §3.1).
enum RefreshTrigger {
    /// - A configured status (401 always) with no Bearer or DPoP `error`, or `error="invalid_token"`: refresh.
    /// - `insufficient_scope`, `invalid_request`, DPoP's `use_dpop_nonce` (a nonce challenge, answered by a
    ///   resend, never a refresh: see `isNonceChallenge`) or any other error: pass the response through.
    static func indicatesExpiredToken(status: Int, challenges: [String], triggerStatuses: Set<Int>) -> Bool {
        guard triggerStatuses.contains(status) else { return false }
        guard let error = bearerError(in: challenges) ?? dpopError(in: challenges) else { return true }
        return error == "invalid_token"
    }

    /// RFC 9449 §9: a 401 whose DPoP challenge says `use_dpop_nonce`: the server wants a proof with the
    /// nonce it sent in `DPoP-Nonce`; the token is fine.
    static func isNonceChallenge(status: Int, challenges: [String]) -> Bool {
        status == 401 && dpopError(in: challenges) == "use_dpop_nonce"
    }

    /// The `error` parameter of the DPoP challenge, if any.
    static func dpopError(in challenges: [String]) -> String? {
        AuthenticationChallenges.parameter("error", ofScheme: "dpop", in: challenges)
    }

    /// The `error` parameter of the Bearer challenge, if any (read up to the next challenge, so that
    /// `Bearer, DPoP error="use_dpop_nonce"` gives Bearer no error).
    static func bearerError(in challenges: [String]) -> String? {
        AuthenticationChallenges.parameter("error", ofScheme: "bearer", in: challenges)
    }
}
