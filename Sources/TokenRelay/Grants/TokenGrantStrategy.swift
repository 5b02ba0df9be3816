import CLibevent

/// One HTTP request to the token endpoint, fully built: method, target, headers, body.
struct TokenHTTPRequest {
    var method: evhttp_cmd_type
    var target: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]

    /// Fills evhttp's outgoing request: `Host`, the grant's headers, and the body with an exact
    /// Content-Length (evhttp adds one only for POST and PUT; a GET without a body gets none).
    func write(into request: OpaquePointer, authority: String) {
        let headers = HeaderList(raw: evhttp_request_get_output_headers(request))
        headers.add("Host", authority)
        for header in self.headers { headers.add(header.name, header.value) }
        if !body.isEmpty || method != EVHTTP_REQ_GET { headers.add("Content-Length", String(body.count)) }
        if !body.isEmpty { body.withUnsafeBytes { _ = evbuffer_add(evhttp_request_get_output_buffer(request), $0.baseAddress, $0.count) } }
    }
}

/// Which grant obtains new tokens. The coordinator (single flight, lock, persistence, latch, metrics) and
/// the HTTP client stay the same for every grant; only the request and the reading of its answer differ.
protocol TokenGrantStrategy {
    /// Without a refresh token this grant cannot run: a token file lacking one means "login required".
    var needsRefreshToken: Bool { get }

    /// The request for the current tokens, or why none can be sent (a value that cannot go where the
    /// template puts it, such as a refresh token with a line break bound for a header).
    func makeRequest(current: TokenSet) -> Result<TokenHTTPRequest, UnusableRequest>

    /// What a complete response means.
    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult
}

struct UnusableRequest: Error {
    let reason: String
}

enum TokenGrants {
    /// The strategy for `refresh.grant`, given the client secret loaded at start.
    static func make(_ settings: Config.Refresh, clientSecret: String?) -> TokenGrantStrategy {
        switch settings.grant {
        case .refreshToken: OAuthFormGrant(kind: .refreshToken, settings: settings, clientSecret: clientSecret)
        case .clientCredentials: OAuthFormGrant(kind: .clientCredentials, settings: settings, clientSecret: clientSecret)
        case .custom: CustomGrant(settings: settings.custom!, clientID: settings.clientID, clientSecret: clientSecret)
        }
    }
}
