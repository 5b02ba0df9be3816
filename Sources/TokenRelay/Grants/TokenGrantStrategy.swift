import HTTPTransport

/// One HTTP request to the token endpoint, fully built: method, target, headers, body.
struct TokenHTTPRequest {
    var method: String
    var target: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]

    /// The request for the transport: `Host` first, then the grant's headers. The transport frames the
    /// body (a Content-Length for any body, and for every method but GET and HEAD also when empty).
    func exchangeRequest(to endpoint: HTTPEndpoint, tls: TransportTLSClientContext?) -> HTTPExchange.Request {
        HTTPExchange.Request(host: endpoint.host, port: UInt16(clamping: endpoint.port), tls: tls, method: method,
                             target: target, fields: [("Host", endpoint.authority)] + headers, body: body)
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
