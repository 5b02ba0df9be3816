import FoundationEssentials

/// A token endpoint for `tokenrelay demo` that behaves like a strict real one: short-lived access
/// tokens, a new refresh token on every refresh, and reuse detection that revokes the whole session
/// when a burnt refresh token comes back.
final class DemoTokenServer {
    let accessTokenLifetime: Double
    private(set) var listener: SmallHTTPServer!
    /// The demo's requests are small: a form, a bearer token.
    static let limits = SmallHTTPServer.Limits(maxHeadBytes: 16 * 1024, maxBodyBytes: 64 * 1024, timeoutSeconds: 30)
    private var serial = 0
    private var currentAccess: (token: String, expires: Double)?
    private var currentRefresh: String?
    private var burnt: Set<String> = []
    private(set) var refreshCount = 0
    private(set) var reuseDetections = 0
    var onEvent: ((String) -> Void)?

    init(loop: EventLoop, accessTokenLifetime: Double) throws {
        self.accessTokenLifetime = accessTokenLifetime
        listener = try SmallHTTPServer(loop: loop, host: "127.0.0.1", port: 0, limits: Self.limits) { [unowned self] request, responder in
            self.handle(request, responder)
        }
    }

    var url: String { "http://127.0.0.1:\(listener.boundPort)/oauth/token" }

    /// The tokens a login would have produced.
    func issueInitialTokens() -> (access: String, refresh: String) {
        issue()
    }

    func isValid(accessToken: String) -> Bool {
        guard let current = currentAccess else { return false }
        return current.token == accessToken && EventLoop.monotonicNow < current.expires
    }

    private func issue() -> (access: String, refresh: String) {
        serial += 1
        let access = "demo-access-\(serial)-\(UInt32.random(in: 0...UInt32.max))"
        let refresh = "demo-refresh-\(serial)-\(UInt32.random(in: 0...UInt32.max))"
        if let old = currentRefresh { burnt.insert(old) }
        currentAccess = (access, EventLoop.monotonicNow + accessTokenLifetime)
        currentRefresh = refresh
        return (access, refresh)
    }

    private func handle(_ request: SmallRequest, _ responder: SmallResponder) {
        guard request.method == .post else { return reply(responder, 405, ["error": "invalid_request"]) }
        let fields = FormFields(request.body)
        guard fields["grant_type"] == "refresh_token", let presented = fields["refresh_token"] else {
            return reply(responder, 400, ["error": "unsupported_grant_type"])
        }
        refreshCount += 1
        if presented == currentRefresh {
            let tokens = issue()
            onEvent?("token server: refresh #\(refreshCount) accepted, refresh token rotated, new access token valid \(Int(accessTokenLifetime))s")
            return reply(responder, 200, ["access_token": tokens.access, "token_type": "Bearer",
                                        "expires_in": Int(accessTokenLifetime), "refresh_token": tokens.refresh])
        }
        if burnt.contains(presented) {
            reuseDetections += 1
            currentAccess = nil
            currentRefresh = nil
            onEvent?("token server: REUSE of a burnt refresh token detected; session revoked")
        }
        reply(responder, 400, ["error": "invalid_grant"])
    }

    private func reply(_ responder: SmallResponder, _ status: Int, _ json: [String: Any]) {
        responder.respond(status: status, reason: status == 200 ? "OK" : "Error", fields: [("Content-Type", "application/json")],
                          body: (try? JSONWriter.data(json)) ?? [])
    }
}
