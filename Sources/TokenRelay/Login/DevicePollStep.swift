/// What one answer of the token endpoint means for the device-code poll (RFC 8628 §3.5).
enum DevicePollStep {
    case granted(TokenGrant)
    /// `authorization_pending`: the user has not finished yet.
    case pending
    /// `slow_down`: poll again, 5 s further apart from now on.
    case slowDown
    /// Connect error, timeout, 5xx, 429: the code may still be good, so poll again (backing off).
    case transient(reason: String)
    case failed(LoginError)

    static func classify(_ result: TokenEndpointResult) -> DevicePollStep {
        switch result {
        case .granted(let grant):
            return .granted(grant)
        case .rejected(let status, let error):
            switch error {
            case "authorization_pending": return .pending
            case "slow_down": return .slowDown
            case "access_denied": return .failed(LoginError("access denied: the sign-in was declined"))
            case "expired_token": return .failed(LoginError("the code expired; run login again"))
            case let code?:
                return .failed(LoginError("the token endpoint refused the device code: \(code) (HTTP \(status))"))
            case nil:
                return .failed(LoginError("the token endpoint answered HTTP \(status) without an OAuth error code"))
            }
        case .transient(let reason, _):
            return .transient(reason: reason)
        case .invalidResponse(let reason, _):
            return .failed(LoginError("the token endpoint's answer is unusable: \(reason)"))
        case .unusable(let reason):
            return .failed(LoginError(reason))
        }
    }
}
