import HTTPTransport

/// One HTTP request to the token endpoint, fully built: method, target, headers, body.
struct TokenHTTPRequest: Sendable {
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

/// What of the stored tokens a grant may put into its request.
struct TokenRequestInput: Sendable {
    var accessToken: String
    var refreshToken: String?

    init(_ tokens: TokenSet) {
        accessToken = tokens.accessToken
        refreshToken = tokens.refreshToken
    }
}

/// Which grant obtains new tokens. The coordinator (single flight, lock, persistence, latch, metrics) and
/// the HTTP client stay the same for every grant; only the request and the reading of its answer differ.
protocol TokenGrantStrategy: Sendable {
    /// Without a refresh token this grant cannot run: a token file lacking one means "login required".
    var needsRefreshToken: Bool { get }

    /// Whether making the request blocks (it reads a file or signs): `TokenEndpointClient` then makes it
    /// on a helper thread, so the loop — and every proxied request — never waits on a disk or a signature.
    var blocksWhileMakingRequest: Bool { get }

    /// The request for the current tokens, or why none can be sent (a value that cannot go where the
    /// template puts it, such as a refresh token with a line break bound for a header; an assertion file
    /// that is missing, which is transient).
    func makeRequest(for tokens: TokenRequestInput) -> Result<TokenHTTPRequest, UnusableRequest>

    /// What a complete response means.
    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult
}

extension TokenGrantStrategy {
    var blocksWhileMakingRequest: Bool { false }

    func makeRequest(current: TokenSet) -> Result<TokenHTTPRequest, UnusableRequest> {
        makeRequest(for: TokenRequestInput(current))
    }
}

struct UnusableRequest: Error {
    let reason: String
    /// Nothing is wrong with the tokens, only with a credential that may be back by the next attempt (an
    /// assertion file being replaced): a transient failure, not "login required".
    var transient = false

    static func credential(_ unavailable: CredentialUnavailable) -> UnusableRequest {
        UnusableRequest(reason: unavailable.reason, transient: true)
    }
}

enum TokenGrants {
    /// The strategy for `refresh.grant`, given the client secret and keys `Preflight` loaded.
    static func make(_ settings: Config.Refresh, clientSecret: String?, keys: CredentialKeys = .none) -> TokenGrantStrategy {
        let client = ClientCredentials.make(settings, clientSecret: clientSecret, keys: keys)
        return switch settings.grant {
        case .refreshToken: OAuthFormGrant(kind: .refreshToken, settings: settings, client: client)
        case .clientCredentials: OAuthFormGrant(kind: .clientCredentials, settings: settings, client: client)
        case .custom: CustomGrant(settings: settings.custom!, clientID: settings.clientID, clientSecret: clientSecret)
        case .jwtBearer: JWTBearerGrant(settings: settings, assertion: JWTBearerAssertion.make(settings.assertion, signer: keys.grantAssertion), client: client)
        case .tokenExchange: TokenExchangeGrant(settings: settings, exchange: settings.tokenExchange!, client: client)
        }
    }
}
