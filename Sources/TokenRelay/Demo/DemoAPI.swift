import CLibevent
import FoundationEssentials

/// The protected API of `tokenrelay demo`: 200 for the token server's current access token, 401 with
/// `WWW-Authenticate: Bearer error="invalid_token"` for anything else, as an OAuth resource server does.
final class DemoAPI {
    private(set) var listener: HTTPListener!
    private unowned let tokenServer: DemoTokenServer
    private(set) var unauthorizedCount = 0

    init(loop: EventLoop, tokenServer: DemoTokenServer) throws {
        self.tokenServer = tokenServer
        listener = try HTTPListener(loop: loop, host: "127.0.0.1", port: 0) { [unowned self] request in self.handle(request) }
    }

    var url: String { "http://127.0.0.1:\(listener.boundPort)" }

    private func handle(_ request: OpaquePointer) {
        let headers = HeaderList(raw: evhttp_request_get_input_headers(request))
        let output = HeaderList(raw: evhttp_request_get_output_headers(request))
        output.add("Content-Type", "application/json")
        let buffer = evbuffer_new()!
        defer { evbuffer_free(buffer) }
        let authorization = headers.value("Authorization") ?? ""
        let token = authorization.hasPrefix("Bearer ") ? String(authorization.dropFirst(7)) : ""
        if tokenServer.isValid(accessToken: token) {
            EvBuffer.append(buffer, "{\"message\":\"hello from the demo API\"}\n")
            evhttp_send_reply(request, 200, "OK", buffer)
        } else {
            unauthorizedCount += 1
            output.add("WWW-Authenticate", "Bearer error=\"invalid_token\"")
            EvBuffer.append(buffer, "{\"error\":\"invalid_token\"}\n")
            evhttp_send_reply(request, 401, "Unauthorized", buffer)
        }
    }
}
