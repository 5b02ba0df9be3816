import CLibevent
import FoundationEssentials

/// A token endpoint for `tokenrelay demo` that behaves like a strict real one: short-lived access
/// tokens, a new refresh token on every refresh, and reuse detection that revokes the whole session
/// when a burnt refresh token comes back.
final class DemoTokenServer {
    let accessTokenLifetime: Double
    private(set) var listener: HTTPListener!
    private var serial = 0
    private var currentAccess: (token: String, expires: Double)?
    private var currentRefresh: String?
    private var burnt: Set<String> = []
    private(set) var refreshCount = 0
    private(set) var reuseDetections = 0
    var onEvent: ((String) -> Void)?

    init(loop: EventLoop, accessTokenLifetime: Double) throws {
        self.accessTokenLifetime = accessTokenLifetime
        listener = try HTTPListener(loop: loop, host: "127.0.0.1", port: 0) { [unowned self] request in self.handle(request) }
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

    private func handle(_ request: OpaquePointer) {
        guard evhttp_request_get_command(request) == EVHTTP_REQ_POST else { return reply(request, 405, ["error": "invalid_request"]) }
        let body = String(decoding: EvBuffer.bytes(evhttp_request_get_input_buffer(request)), as: UTF8.self)
        var form = evkeyvalq()
        evhttp_parse_query_str(body, &form)
        defer { evhttp_clear_headers(&form) }
        let fields = withUnsafeMutablePointer(to: &form) { HeaderList(raw: $0) }
        guard fields.value("grant_type") == "refresh_token", let presented = fields.value("refresh_token") else {
            return reply(request, 400, ["error": "unsupported_grant_type"])
        }
        refreshCount += 1
        if presented == currentRefresh {
            let tokens = issue()
            onEvent?("token server: refresh #\(refreshCount) accepted, refresh token rotated, new access token valid \(Int(accessTokenLifetime))s")
            return reply(request, 200, ["access_token": tokens.access, "token_type": "Bearer",
                                        "expires_in": Int(accessTokenLifetime), "refresh_token": tokens.refresh])
        }
        if burnt.contains(presented) {
            reuseDetections += 1
            currentAccess = nil
            currentRefresh = nil
            onEvent?("token server: REUSE of a burnt refresh token detected; session revoked")
        }
        reply(request, 400, ["error": "invalid_grant"])
    }

    private func reply(_ request: OpaquePointer, _ status: Int32, _ json: [String: Any]) {
        HeaderList(raw: evhttp_request_get_output_headers(request)).add("Content-Type", "application/json")
        let buffer = evbuffer_new()!
        EvBuffer.append(buffer, (try? JSONWriter.data(json)) ?? [])
        evhttp_send_reply(request, status, status == 200 ? "OK" : "Error", buffer)
        evbuffer_free(buffer)
    }
}
