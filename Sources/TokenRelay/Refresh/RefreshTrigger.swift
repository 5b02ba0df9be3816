import Foundation

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

    private static let errorParameter = try! NSRegularExpression(
        pattern: #"(?:^|[\s,])error\s*=\s*(?:"([^"]*)"|([^\s,"]+))"#, options: [.caseInsensitive])

    /// The `error` parameter of the Bearer challenge, if any.
    static func bearerError(in challenges: [String]) -> String? {
        for challenge in challenges {
            guard let bearer = challenge.range(of: "bearer", options: [.caseInsensitive]) else { continue }
            let parameters = String(challenge[bearer.upperBound...])
            let range = NSRange(parameters.startIndex..., in: parameters)
            guard let match = errorParameter.firstMatch(in: parameters, range: range) else { continue }
            for group in 1...2 {
                if let captured = Range(match.range(at: group), in: parameters) { return String(parameters[captured]) }
            }
        }
        return nil
    }
}
