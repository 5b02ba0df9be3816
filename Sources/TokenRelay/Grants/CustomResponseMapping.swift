import FoundationEssentials

/// Reads the custom grant's answer through the configured JSON Pointers, and maps failures:
///
/// - an error code in `login_required_errors` (read at the `error` pointer), whatever the status, or a
///   status in `login_required_statuses` (default 400, 401, 403): the credentials are dead, latch
///   "login required";
/// - 408, 425, 429, 5xx: transient, retried with backoff;
/// - any other status (404, 405, 3xx, …): the cycle fails without retry and without a latch. Such an
///   answer usually means a wrong URL or method, which retrying the identical request cannot fix, but
///   which is no reason to declare the session dead either; the next cycle tries again.
struct CustomResponseMapping {
    let settings: CustomGrantSettings

    func classify(status: Int, body: [UInt8], now: Date) -> TokenEndpointResult {
        let json = TokenEndpointJSON.parse(body)
        if let code = json.flatMap(loginRequiredError) { return .rejected(status: status, oauthError: code) }
        if (200..<300).contains(status) { return parse(json, now: now) }
        if settings.loginRequiredStatuses.contains(status) { return .rejected(status: status, oauthError: nil) }
        switch status {
        case 408, 425, 429, 500..<600:
            return .transient(reason: "token endpoint answered \(status)", outcomeUnknown: false)
        default:
            return .invalidResponse(reason: "token endpoint answered \(status) (not in refresh.response.login_required_statuses)",
                                    rotation: .none)
        }
    }

    /// A configured "log in again" error code found at `refresh.response.error`, whatever the status.
    private func loginRequiredError(in json: Any) -> String? {
        guard let pointer = settings.errorCode, !settings.loginRequiredErrors.isEmpty,
              let code = pointer.evaluate(json) as? String, settings.loginRequiredErrors.contains(code) else { return nil }
        return code
    }

    private func parse(_ json: Any?, now: Date) -> TokenEndpointResult {
        guard let json else { return .invalidResponse(reason: "response body is not JSON", rotation: .unknown) }
        var rotation = TokenEndpointResult.Rotation.none
        if let pointer = settings.refreshToken, let value = pointer.evaluate(json), !(value is JSONNull) {
            guard let refresh = value as? String, TokenSet.unusableReason(refresh) == nil else {
                return .invalidResponse(reason: "the refresh token at \(pointer) is not a usable string", rotation: .unknown)
            }
            rotation = .rotated(to: refresh)
        }
        guard let access = settings.accessToken.evaluate(json) as? String, TokenSet.unusableReason(access) == nil else {
            return .invalidResponse(reason: "no usable access token at \(settings.accessToken) (a string of visible ASCII, at most \(TokenSet.maximumTokenBytes) bytes)",
                                    rotation: rotation)
        }
        var grant = TokenGrant(accessToken: access)
        if case .rotated(let refresh) = rotation { grant.refreshToken = refresh }
        switch settings.expiry {
        case nil:
            break
        case .seconds(let pointer)?:
            grant.expiresIn = TokenEndpointResult.expiresIn(pointer.evaluate(json), field: "the value at \(pointer)", warnings: &grant.warnings)
        case .absolute(let pointer)?:
            guard let value = pointer.evaluate(json), !(value is JSONNull) else { break }
            if let date = Timestamp.date(value), date > now {
                grant.expiresIn = TokenEndpointResult.clampedLifetime(date.timeIntervalSince(now), field: "the value at \(pointer)",
                                                                      warnings: &grant.warnings)
            } else {
                grant.warnings.append("ignored the value at \(pointer): not a future RFC 3339 time or epoch seconds")
            }
        }
        grant.noteClampedJWTExpiry(now: now)
        return .granted(grant)
    }
}
