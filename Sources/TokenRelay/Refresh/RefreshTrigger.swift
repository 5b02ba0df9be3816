
/// Decides whether an upstream response says "this access token is no longer accepted", which a
/// refresh can fix, as opposed to "this token may not do that", which it cannot (RFC 6750 §3.1).
enum RefreshTrigger {
    /// - A configured status (401 always) with no Bearer `error`, or `error="invalid_token"`: refresh.
    /// - `insufficient_scope`, `invalid_request` or any other error: pass the response through.
    static func indicatesExpiredToken(status: Int, challenges: [String], triggerStatuses: Set<Int>) -> Bool {
        guard triggerStatuses.contains(status) else { return false }
        guard let error = bearerError(in: challenges) else { return true }
        return error == "invalid_token"
    }

    /// `error=` at the start or after whitespace/comma, its value quoted or a bare token.
    nonisolated(unsafe) private static let errorParameter = #/(?:^|[\s,])error\s*=\s*(?:"([^"]*)"|([^\s,"]+))/#
        .ignoresCase().matchingSemantics(.unicodeScalar)

    /// The `error` parameter of the Bearer challenge, if any.
    static func bearerError(in challenges: [String]) -> String? {
        for challenge in challenges {
            guard let bearer = challenge.rangeIgnoringASCIICase(of: "bearer") else { continue }
            let parameters = String(challenge[bearer.upperBound...])
            guard let match = parameters.firstMatch(of: errorParameter) else { continue }
            if let quoted = match.output.1 { return String(quoted) }
            if let bare = match.output.2 { return String(bare) }
        }
        return nil
    }
}
