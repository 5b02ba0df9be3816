import Foundation

/// The protected upstream API behind the proxy. It accepts only bearer tokens that the validator
/// (normally `FakeTokenServer.isAccessTokenValid`) accepts, so a test observes exactly what a real
/// resource server would: a stale or missing token yields 401 + `WWW-Authenticate` (RFC 6750 §3),
/// which is the signal the proxy must react to by refreshing and replaying.
///
/// 200 answers describe what arrived (`method`, `path`, `target`, `body_length`, `body_fnv1a64`),
/// so tests can prove the proxy forwarded the body unchanged without echoing megabytes back.
/// `/echo` returns the request body verbatim instead.
///
/// A head with `Expect: 100-continue` is judged before its body, as a real resource server does: an
/// unusable token gets its 401 at once (the body is never read, the connection closes), a usable one
/// gets `100 Continue`. `expectation = .ignore` plays an old server that never answers 100.
final class FakeAPIServer: @unchecked Sendable { // @unchecked: `http` is set once in init
    enum ExpectationMode: Sendable {
        case checkTokenFirst
        case ignore
    }

    typealias TokenValidator = @Sendable (String) -> Bool
    typealias ResponseOverride = @Sendable (RecordedRequest) -> TestResponse?

    private struct State {
        var requests: [RecordedRequest] = []
        var unauthorized = 0
        var delay: Double = 0
        var forcedUnauthorized: [String: Int] = [:]
        var override: ResponseOverride?
        var expectation = ExpectationMode.checkTokenFirst
        var continuesSent = 0
        var answeredBeforeBody = 0
    }

    private let validate: TokenValidator
    /// nil: `Authorization: Bearer <token>`; otherwise the whole value of this header is the token.
    private let tokenHeader: String?
    private let state = Locked(State())
    private var http: MiniHTTPServer!

    var port: Int { http.port }
    var baseURL: String { http.baseURL }

    /// - Parameter tokenHeader: read the token from this header (its whole value) instead of a Bearer
    ///   `Authorization`, like APIs that want `accessToken: <token>`.
    init(validateToken: @escaping TokenValidator, tokenHeader: String? = nil) throws {
        validate = validateToken
        self.tokenHeader = tokenHeader
        http = try MiniHTTPServer(expectation: { [weak self] head in
            self?.answerExpectation(head) ?? .sendContinue
        }) { [weak self] request in
            self?.handle(request) ?? TestResponse(status: 503)
        }
    }

    convenience init(tokenServer: FakeTokenServer, tokenHeader: String? = nil) throws {
        try self.init(validateToken: { tokenServer.isAccessTokenValid($0) }, tokenHeader: tokenHeader)
    }

    deinit { http?.stop() }

    func stop() { http.stop() }

    /// Every request received, authorized or not, in arrival order.
    var requests: [RecordedRequest] { state.withLock { $0.requests } }
    var requestCount: Int { state.withLock { $0.requests.count } }
    var unauthorizedCount: Int { state.withLock { $0.unauthorized } }
    /// TCP connections accepted so far (upstream keep-alive checks).
    var acceptedConnections: Int { http.acceptedConnections }
    /// TCP connections open right now (idle pool timeout checks).
    var openConnections: Int { http.openConnections }
    /// Open connections the client has not closed (counted at accept: see `LoopbackAcceptor.liveConnections`).
    var liveConnections: Int { http.liveConnections }
    /// Called after each accept (a census across upstreams).
    var onAccepted: (@Sendable () -> Void)? {
        get { http.onAccepted }
        set { http.onAccepted = newValue }
    }

    /// Delay before every answer, capped at 60 s and cut short by stop(), to simulate a slow upstream.
    var responseDelay: Double {
        get { state.withLock { $0.delay } }
        set { state.withLock { $0.delay = min(max(newValue, 0), 60) } }
    }

    /// Called for authorized requests; a non-nil result replaces the normal answer (e.g. a 500,
    /// odd headers, or `Connection: close`).
    var responseOverride: ResponseOverride? {
        get { state.withLock { $0.override } }
        set { state.withLock { $0.override = newValue } }
    }

    /// How a head with `Expect: 100-continue` is answered.
    var expectation: ExpectationMode {
        get { state.withLock { $0.expectation } }
        set { state.withLock { $0.expectation = newValue } }
    }
    /// `100 Continue` answers sent.
    var continuesSent: Int { state.withLock { $0.continuesSent } }
    /// Requests answered (401) on their head alone, their body never read; they are in `requests` with
    /// an empty body.
    var answeredBeforeBody: Int { state.withLock { $0.answeredBeforeBody } }

    /// The next request to `path` (query ignored) gets 401 even with a valid token: simulates a
    /// token that died between the proxy's check and the upstream's (stale-generation tests).
    func forceUnauthorizedOnce(path: String) {
        state.withLock { $0.forcedUnauthorized[path, default: 0] += 1 }
    }

    private func answerExpectation(_ head: RecordedRequest) -> MiniHTTPServer.ExpectationAnswer {
        if expectation == .ignore { return .ignore }
        let token = tokenHeader.map { head.header($0) } ?? head.bearerToken
        guard let token, !token.isEmpty, validate(token) else {
            state.withLock { s in
                s.requests.append(head)
                s.unauthorized += 1
                s.answeredBeforeBody += 1
            }
            return .answer(Self.unauthorized)
        }
        state.withLock { $0.continuesSent += 1 }
        return .sendContinue
    }

    private static let unauthorized = TestResponse.json(401, ["error": "invalid_token"],
                                                        headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")])

    private func handle(_ request: RecordedRequest) -> TestResponse {
        let (delay, forced, override) = state.withLock { s in
            s.requests.append(request)
            let forced = s.forcedUnauthorized[request.path, default: 0] > 0
            if forced { s.forcedUnauthorized[request.path]! -= 1 }
            return (s.delay, forced, s.override)
        }
        if delay > 0 { http.interruptibleDelay(delay) }
        let token = tokenHeader.map { request.header($0) } ?? request.bearerToken
        guard !forced, let token, !token.isEmpty, validate(token) else {
            state.withLock { $0.unauthorized += 1 }
            return Self.unauthorized
        }
        if let response = override?(request) { return response }
        if request.path == "/echo" {
            let type = request.header("Content-Type") ?? "application/octet-stream"
            return TestResponse(status: 200, headers: [("Content-Type", type)], body: request.body)
        }
        return .json(200, ["method": request.method, "path": request.path, "target": request.target,
                           "body_length": request.body.count, "body_fnv1a64": fnv1a64Hex(request.body)])
    }
}

extension RecordedRequest {
    /// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), if any.
    var bearerToken: String? {
        guard let value = header("Authorization"), value.lowercased().hasPrefix("bearer ") else { return nil }
        let token = value.dropFirst(7).trimmingCharacters(in: .whitespaces)
        return token.isEmpty ? nil : token
    }
}

/// FNV-1a 64-bit digest as 16 lowercase hex digits. Not cryptographic; only to detect a body that
/// was altered in transit (CryptoKit is not available on Linux without a package dependency).
func fnv1a64Hex(_ data: Data) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in data { hash = (hash ^ UInt64(byte)) &* 0x0000_0100_0000_01b3 }
    let hex = String(hash, radix: 16)
    return String(repeating: "0", count: 16 - hex.count) + hex
}
