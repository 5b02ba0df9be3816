import Foundation

/// A fake OAuth 2.0 token endpoint (RFC 6749 §6, refresh_token grant) at `/oauth/token`, with
/// refresh-token rotation and reuse detection (OAuth 2.0 Security BCP §4.14.2).
///
/// Rotation is what makes a token relay hard: every refresh burns the presented refresh token, and
/// presenting a burnt one revokes the whole token family. A proxy that ever refreshes twice with
/// the same token (races, retries after an ambiguous failure, two instances) is caught here by
/// `reuseDetections > 0` and by its access token becoming invalid, exactly as a strict real
/// provider would behave.
final class FakeTokenServer: @unchecked Sendable { // @unchecked: `http` is set once in init
    enum ClientAuth: Sendable { case basic, post }

    enum FailureMode: Sendable, Equatable {
        case normal
        /// Every grant fails with 400 invalid_grant (refresh token treated as dead).
        case rejectAll
        /// Answers `status` (with `Retry-After` when given) without looking at (or consuming) the refresh token.
        case unavailable(status: Int, retryAfter: String? = nil)
        /// Waits `seconds` (bounded, cut short by stop()) and then answers normally.
        case delay(Double)
        /// Waits until `openGate()` (at most 30 s, cut short by stop()) and then answers normally: a
        /// refresh the test keeps in flight for as long as it needs, without guessing a delay.
        case gated
    }

    static let tokenPath = "/oauth/token"
    /// A seed-style mobile backend's refresh endpoint on the same token families: the refresh token in
    /// the `X-Refresh-Token` header, a JSON body `{"clientId": …}`, and the answer nested under `data`
    /// (`{"data":{"accessToken":…,"refreshToken":…,"expiresIn":…}}`), rotating on every call.
    static let seedPath = "/auth/token"
    /// `GET /introspect?token=T`: 204 when T is a current access token (`isAccessTokenValid`), else 401.
    static let introspectionPath = "/introspect"

    let clientID: String
    /// The secret client authentication must present; a test may rotate it (`clientSecret = …`).
    var clientSecret: String {
        get { state.withLock { $0.clientSecret } }
        set { state.withLock { $0.clientSecret = newValue } }
    }
    /// nil = access tokens never expire by time (and `expires_in` is omitted).
    let accessTokenLifetime: Double?
    let expectedClientAuth: ClientAuth

    private struct Family {
        var access: String
        var accessIssuedAt: Double
        var refresh: String
        var burnt: Set<String> = []
        var revoked = false
    }

    private struct State {
        var families: [Family] = []
        var familyOfRefreshToken: [String: Int] = [:] // current and burnt tokens alike
        var manuallyExpired: Set<String> = []
        var serial = 0
        var mode = FailureMode.normal
        var clientSecret = ""
        var gateOpen = false
        var refreshCalls = 0, successfulRefreshes = 0, reuseDetections = 0, clientCredentialsGrants = 0
        var received: [RecordedRequest] = []
        var olderAccessTokensStayValid = false
        /// Access tokens a rotation replaced, with their family and issue time.
        var replacedAccess: [String: (family: Int, issuedAt: Double)] = [:]
    }

    /// An access token a rotation replaced stays valid until its own expiry (most APIs: a JWT is good until
    /// its `exp`), instead of dying with the rotation. Then a relay that has not adopted the new set yet gets
    /// no 401 that would start a cycle of its own.
    var olderAccessTokensStayValid: Bool {
        get { state.withLock { $0.olderAccessTokensStayValid } }
        set { state.withLock { $0.olderAccessTokensStayValid = newValue } }
    }

    private let state = Locked(State())
    private var http: MiniHTTPServer!

    var port: Int { http.port }
    var baseURL: String { http.baseURL }
    /// The full token endpoint URL to put into the product's config.
    var tokenURL: String { baseURL + Self.tokenPath }
    var seedURL: String { baseURL + Self.seedPath }

    init(clientID: String = "test-client", clientSecret: String = "test-secret",
         accessTokenLifetime: Double? = 3600, expectedClientAuth: ClientAuth = .basic) throws {
        self.clientID = clientID
        self.accessTokenLifetime = accessTokenLifetime
        self.expectedClientAuth = expectedClientAuth
        state.withLock { $0.clientSecret = clientSecret }
        http = try MiniHTTPServer { [weak self] request in
            self?.handle(request) ?? TestResponse(status: 503)
        }
    }

    deinit { http?.stop() }

    func stop() { http.stop() }

    var failureMode: FailureMode {
        get { state.withLock { $0.mode } }
        set { state.withLock { $0.mode = newValue } }
    }

    /// All POSTs to the token path, whatever their outcome.
    /// Lets gated token requests (`FailureMode.gated`) through.
    func openGate() { state.withLock { $0.gateOpen = true } }
    /// Holds gated token requests again (the next gated refresh waits for `openGate()`).
    func closeGate() { state.withLock { $0.gateOpen = false } }

    var refreshCalls: Int { state.withLock { $0.refreshCalls } }
    var successfulRefreshes: Int { state.withLock { $0.successfulRefreshes } }
    var reuseDetections: Int { state.withLock { $0.reuseDetections } }
    /// Successful client_credentials grants (each issues a new access token and no refresh token).
    var clientCredentialsGrants: Int { state.withLock { $0.clientCredentialsGrants } }
    /// Every request received (any path), so tests can check form bodies and headers.
    var receivedRequests: [RecordedRequest] { state.withLock { $0.received } }
    /// Current tokens of the most recently issued family.
    var currentAccessToken: String? { state.withLock { $0.families.last?.access } }
    var currentRefreshToken: String? { state.withLock { $0.families.last?.refresh } }
    /// Whether the most recently issued family was revoked by reuse detection.
    var isCurrentFamilyRevoked: Bool { state.withLock { $0.families.last?.revoked ?? false } }

    /// Starts a new token family, as if the user had just completed the authorization flow.
    func issueInitialTokens() -> (access: String, refresh: String) {
        state.withLock { s in
            let (access, refresh) = Self.newTokens(&s)
            s.families.append(Family(access: access, accessIssuedAt: Self.now(), refresh: refresh))
            s.familyOfRefreshToken[refresh] = s.families.count - 1
            return (access, refresh)
        }
    }

    /// True only for a family's current access token that is neither revoked nor expired.
    func isAccessTokenValid(_ token: String) -> Bool {
        state.withLock { s in
            guard !s.manuallyExpired.contains(token) else { return false }
            if s.olderAccessTokensStayValid, let replaced = s.replacedAccess[token] {
                return !s.families[replaced.family].revoked && !isExpired(issuedAt: replaced.issuedAt)
            }
            return s.families.contains { $0.access == token && !$0.revoked && !isExpired($0) }
        }
    }

    /// Makes every access token issued so far invalid now; refresh tokens stay usable.
    func expireAccessTokens() {
        state.withLock { s in s.manuallyExpired.formUnion(s.families.map(\.access)) }
    }

    // MARK: - Request handling

    private func handle(_ request: RecordedRequest) -> TestResponse {
        // An API in another process (the gRPC test server) asks here whether a token is current. Not a
        // token request: neither recorded nor counted.
        if request.method == "GET" && request.path == Self.introspectionPath {
            let token = request.query.map(Self.parseForm)?["token"] ?? ""
            return TestResponse(status: isAccessTokenValid(token) ? 204 : 401)
        }
        let isSeed = request.path == Self.seedPath
        let mode: FailureMode? = state.withLock { s in
            s.received.append(request)
            guard request.method == "POST" && (request.path == Self.tokenPath || isSeed) else { return nil }
            s.refreshCalls += 1
            return s.mode
        }
        guard let mode else { return .json(404, ["error": "not_found"]) }
        switch mode {
        case .unavailable(let status, let retryAfter):
            return .json(status, ["error": "temporarily_unavailable"], headers: retryAfter.map { [("Retry-After", $0)] } ?? [])
        case .delay(let seconds):
            guard http.interruptibleDelay(seconds) else { return .json(503, ["error": "server stopping"]) }
        case .gated:
            let deadline = Date(timeIntervalSinceNow: 30)
            while !state.withLock({ $0.gateOpen }) && Date() < deadline {
                guard http.interruptibleDelay(0.01) else { return .json(503, ["error": "server stopping"]) }
            }
        case .normal, .rejectAll: break
        }
        if isSeed { return handleSeed(request, rejectAll: mode == .rejectAll) }
        guard request.header("Content-Type")?.lowercased().hasPrefix("application/x-www-form-urlencoded") == true else {
            return Self.error(400, "invalid_request", "expected an application/x-www-form-urlencoded body")
        }
        let form = Self.parseForm(request.bodyText)
        guard isClientAuthenticated(request, form) else {
            let challenge: [(String, String)] = expectedClientAuth == .basic ? [("WWW-Authenticate", "Basic realm=\"fake\"")] : []
            return .json(401, ["error": "invalid_client"], headers: challenge)
        }
        guard mode != .rejectAll else { return Self.error(400, "invalid_grant", "rejected by test (rejectAll)") }
        if form["grant_type"] == "client_credentials" { return state.withLock { issueClientCredentials(&$0) } }
        guard form["grant_type"] == "refresh_token" else { return Self.error(400, "unsupported_grant_type", nil) }
        guard let presented = form["refresh_token"] else { return Self.error(400, "invalid_request", "missing refresh_token") }
        return state.withLock { s in
            switch rotate(presented, &s) {
            case .success(let tokens):
                var body: [String: Any] = ["access_token": tokens.access, "token_type": "Bearer", "refresh_token": tokens.refresh]
                // expires_in is an integer (RFC 6749 §5.1 / A.14); validity here uses the exact lifetime.
                if let lifetime = accessTokenLifetime { body["expires_in"] = Int(lifetime.rounded(.up)) }
                return .json(200, body, headers: [("Cache-Control", "no-store"), ("Pragma", "no-cache")])
            case .failure(let failure):
                return Self.error(400, "invalid_grant", failure.reason)
            }
        }
    }

    /// The seed-style endpoint: JSON in, JSON out, errors as 401 with a body of its own.
    private func handleSeed(_ request: RecordedRequest, rejectAll: Bool) -> TestResponse {
        guard request.header("Content-Type")?.lowercased().hasPrefix("application/json") == true,
              let body = try? JSONSerialization.jsonObject(with: request.body) as? [String: Any],
              body["clientId"] as? String == clientID, body["clientSecret"] as? String == clientSecret else {
            return .json(400, ["error": ["code": "BAD_REQUEST"]])
        }
        guard !rejectAll else { return .json(401, ["error": ["code": "SESSION_EXPIRED"]]) }
        guard let presented = request.header("X-Refresh-Token") else { return .json(400, ["error": ["code": "NO_TOKEN"]]) }
        return state.withLock { s in
            switch rotate(presented, &s) {
            case .success(let tokens):
                var data: [String: Any] = ["accessToken": tokens.access, "refreshToken": tokens.refresh]
                if let lifetime = accessTokenLifetime { data["expiresIn"] = Int(lifetime.rounded(.up)) }
                return .json(200, ["data": data])
            case .failure:
                return .json(401, ["error": ["code": "SESSION_EXPIRED"]])
            }
        }
    }

    /// RFC 6749 §4.4: a new access token, no refresh token.
    private func issueClientCredentials(_ s: inout State) -> TestResponse {
        let (access, _) = Self.newTokens(&s)
        s.families.append(Family(access: access, accessIssuedAt: Self.now(), refresh: ""))
        s.clientCredentialsGrants += 1
        s.successfulRefreshes += 1
        var body: [String: Any] = ["access_token": access, "token_type": "Bearer"]
        if let lifetime = accessTokenLifetime { body["expires_in"] = Int(lifetime.rounded(.up)) }
        return .json(200, body, headers: [("Cache-Control", "no-store")])
    }

    /// Exactly one client authentication method is accepted (RFC 6749 §2.3: a client MUST NOT use
    /// more than one), so a product sending the secret both ways is rejected, not silently accepted.
    private func isClientAuthenticated(_ request: RecordedRequest, _ form: [String: String]) -> Bool {
        switch expectedClientAuth {
        case .post:
            return request.header("Authorization") == nil
                && form["client_id"] == clientID && form["client_secret"] == clientSecret
        case .basic:
            guard form["client_secret"] == nil, let value = request.header("Authorization"),
                  value.lowercased().hasPrefix("basic "),
                  let data = Data(base64Encoded: value.dropFirst(6).trimmingCharacters(in: .whitespaces)),
                  let pair = String(data: data, encoding: .utf8), let colon = pair.firstIndex(of: ":")
            else { return false }
            // RFC 6749 §2.3.1: id and secret are form-urlencoded before base64.
            return Self.formDecode(pair[..<colon]) == clientID
                && Self.formDecode(pair[pair.index(after: colon)...]) == clientSecret
        }
    }

    private struct RotationFailure: Error { let reason: String }

    private func rotate(_ presented: String, _ s: inout State) -> Result<(access: String, refresh: String), RotationFailure> {
        guard let index = s.familyOfRefreshToken[presented] else { return .failure(RotationFailure(reason: "unknown refresh token")) }
        if s.families[index].burnt.contains(presented) {
            s.reuseDetections += 1
            s.families[index].revoked = true
            return .failure(RotationFailure(reason: "refresh token reuse detected"))
        }
        guard !s.families[index].revoked else { return .failure(RotationFailure(reason: "token family revoked")) }
        let (access, refresh) = Self.newTokens(&s)
        s.families[index].burnt.insert(presented)
        s.replacedAccess[s.families[index].access] = (index, s.families[index].accessIssuedAt)
        s.families[index].access = access
        s.families[index].accessIssuedAt = Self.now()
        s.families[index].refresh = refresh
        s.familyOfRefreshToken[refresh] = index
        s.successfulRefreshes += 1
        return .success((access, refresh))
    }

    private func isExpired(_ family: Family) -> Bool { isExpired(issuedAt: family.accessIssuedAt) }

    private func isExpired(issuedAt: Double) -> Bool {
        guard let lifetime = accessTokenLifetime else { return false }
        return Self.now() - issuedAt >= lifetime
    }

    /// Monotonic seconds, so wall-clock jumps on the CI machine cannot expire tokens.
    private static func now() -> Double { ProcessInfo.processInfo.systemUptime }

    private static func newTokens(_ s: inout State) -> (String, String) {
        s.serial += 1
        func random() -> String { String(UInt64.random(in: 0...UInt64.max), radix: 16) }
        return ("at-\(s.serial)-\(random())", "rt-\(s.serial)-\(random())")
    }

    private static func error(_ status: Int, _ code: String, _ description: String?) -> TestResponse {
        var body = ["error": code]
        body["error_description"] = description
        return .json(status, body, headers: [("Cache-Control", "no-store")])
    }

    // MARK: - application/x-www-form-urlencoded

    static func parseForm(_ body: String) -> [String: String] {
        var result: [String: String] = [:]
        for pair in body.split(separator: "&") where !pair.isEmpty {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            result[formDecode(parts[0])] = parts.count > 1 ? formDecode(parts[1]) : ""
        }
        return result
    }

    static func formDecode<S: StringProtocol>(_ text: S) -> String {
        let spaced = text.replacingOccurrences(of: "+", with: " ")
        return spaced.removingPercentEncoding ?? spaced
    }

    /// Encodes pairs as a form body (unreserved characters kept, everything else percent-encoded).
    static func formEncode(_ pairs: [(String, String)]) -> String {
        pairs.map { "\(formEncodeComponent($0.0))=\(formEncodeComponent($0.1))" }.joined(separator: "&")
    }

    static func formEncodeComponent(_ text: String) -> String {
        var allowed = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }

    /// The `Authorization` value a correct client sends for `.basic` (RFC 6749 §2.3.1).
    static func basicAuthorization(id: String, secret: String) -> String {
        let pair = formEncodeComponent(id) + ":" + formEncodeComponent(secret)
        return "Basic " + Data(pair.utf8).base64EncodedString()
    }
}
