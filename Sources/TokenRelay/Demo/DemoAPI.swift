import FoundationEssentials

/// The protected API of `tokenrelay demo`: 200 for the token server's current access token, 401 with
/// `WWW-Authenticate: Bearer error="invalid_token"` for anything else, as an OAuth resource server does.
final class DemoAPI {
    private(set) var listener: SmallHTTPServer!
    private unowned let tokenServer: DemoTokenServer
    private(set) var unauthorizedCount = 0

    init(loop: EventLoop, tokenServer: DemoTokenServer) throws {
        self.tokenServer = tokenServer
        listener = try SmallHTTPServer(loop: loop, host: "127.0.0.1", port: 0, limits: DemoTokenServer.limits) { [unowned self] request, responder in
            self.handle(request, responder)
        }
    }

    var url: String { "http://127.0.0.1:\(listener.boundPort)" }

    private func handle(_ request: SmallRequest, _ responder: SmallResponder) {
        let authorization = request.field("Authorization") ?? ""
        let token = authorization.hasPrefix("Bearer ") ? String(authorization.dropFirst(7)) : ""
        if tokenServer.isValid(accessToken: token) {
            responder.respond(status: 200, reason: "OK", fields: [("Content-Type", "application/json")],
                              body: Array("{\"message\":\"hello from the demo API\"}\n".utf8))
        } else {
            unauthorizedCount += 1
            responder.respond(status: 401, reason: "Unauthorized",
                              fields: [("Content-Type", "application/json"), ("WWW-Authenticate", "Bearer error=\"invalid_token\"")],
                              body: Array("{\"error\":\"invalid_token\"}\n".utf8))
        }
    }
}
