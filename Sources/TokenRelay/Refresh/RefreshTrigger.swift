
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
        schemeError(in: challenges, scheme: "dpop")
    }

    /// `error=` at the start or after whitespace/comma, its value quoted or a bare token.
    nonisolated(unsafe) private static let errorParameter = #/(?:^|[\s,])error\s*=\s*(?:"([^"]*)"|([^\s,"]+))/#
        .ignoresCase().matchingSemantics(.unicodeScalar)

    /// The `error` parameter of the Bearer challenge, if any.
    static func bearerError(in challenges: [String]) -> String? {
        schemeError(in: challenges, scheme: "bearer")
    }

    /// The `error` parameter after `scheme` in one of the challenges. Each scheme's parameters are read up to
    /// the next scheme this knows of, so that `Bearer, DPoP error="use_dpop_nonce"` gives Bearer no error.
    private static func schemeError(in challenges: [String], scheme: String) -> String? {
        let other = scheme == "bearer" ? "dpop" : "bearer"
        for challenge in challenges {
            guard let start = challenge.rangeIgnoringASCIICase(of: scheme) else { continue }
            var parameters = String(challenge[start.upperBound...])
            if let next = parameters.rangeIgnoringASCIICase(of: other) { parameters = String(parameters[..<next.lowerBound]) }
            guard let match = parameters.firstMatch(of: errorParameter) else { continue }
            if let quoted = match.output.1 { return String(quoted) }
            if let bare = match.output.2 { return String(bare) }
        }
        return nil
    }
}
