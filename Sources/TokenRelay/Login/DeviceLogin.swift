import FoundationEssentials

/// `tokenrelay login`: the OAuth 2.0 Device Authorization Grant (RFC 8628) for hosts without a browser.
/// Asks the device authorization endpoint for a code, shows the operator where to enter it, polls the
/// token endpoint until the sign-in completes, and writes the token file. The device code and the
/// tokens are never printed; a running tokenrelay picks the new file up through its file watch.
public enum DeviceLogin {
    /// Consecutive connect errors, timeouts or 5xx answers after which polling gives up.
    static let maxTransientFailures = 5

    /// - Parameters:
    ///   - intervalScale: multiplies every wait between polls (tests use 0.01; the protocol's seconds stay
    ///     as the server gave them everywhere else).
    ///   - say: shows a line to the operator at once (the verification URI and user code).
    /// - Returns: the final one-line report.
    public static func run(configPath: String, identity: String? = nil, intervalScale: Double = 1, say: (String) -> Void) throws -> String {
        let config = try ConfigLoader.load(path: configPath).scoped(toIdentityNamed: identity)
        guard let login = config.login else {
            throw ConfigError("login", "is required by tokenrelay login: add at least login.device_authorization_url")
        }
        let secret = try SecretLoader.load(config.refresh.clientSecret)
        let client = ClientCredentials.make(method: config.refresh.clientAuth, clientID: login.clientID, clientSecret: secret,
                                            assertion: config.refresh.clientAssertion, keys: try CredentialKeys.load(config.refresh))
        let timeout = config.timeouts.refreshSeconds
        let authorizationEndpoint = try BlockingHTTPClient(endpoint: login.deviceAuthorizationURL,
                                                           tls: LoginTLS.context(for: login.deviceAuthorizationURL, field: "login.device_authorization_url", config: config),
                                                           timeoutSeconds: timeout)
        let tokenEndpoint = try BlockingHTTPClient(endpoint: login.tokenURL,
                                                   tls: LoginTLS.context(for: login.tokenURL, field: "login.token_url", config: config),
                                                   timeoutSeconds: timeout)
        let redis = try RedisTokenCLI.endpoint(config)
        let codecs = try ConfiguredTokenCodecs(config.tokens)
        let tokenFilePath = redis == nil ? try config.tokens.requireFile(for: "tokenrelay login") : ""
        if redis == nil { try LoginTokenFile.checkWritable(tokenFilePath) }

        var fields: [(String, String)] = []
        if let scope = login.scope { fields.append(("scope", scope)) }
        let authorization = try requestCode(authorizationEndpoint, try form(to: login.deviceAuthorizationURL, fields: fields, client: client))
        let deadline = EventLoop.monotonicNow + authorization.expiresIn
        instructions(for: authorization).forEach(say)

        // Built anew for every poll: a client assertion is good for one request (its jti) and a short time.
        let poll = { () throws -> TokenHTTPRequest in
            try form(to: login.tokenURL, fields: [("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                                                  ("device_code", authorization.deviceCode)], client: client)
        }
        let grant = try pollForTokens(tokenEndpoint, poll, interval: authorization.interval, scale: intervalScale, deadline: deadline)
        guard grant.refreshToken != nil else {
            throw LoginError("the token endpoint granted no refresh token, so tokenrelay could not renew the access token "
                             + "(does the client need the offline_access scope?); token file left unchanged")
        }
        if let (endpoint, settings) = redis {
            let tokens = TokenSet(accessToken: "").renewed(by: grant, now: Date()).tokens
            let version = try RedisTokenCLI.store(tokens, endpoint: endpoint, settings: settings, codec: codecs.redis)
            return "logged in; tokens stored in Redis \(endpoint.description) key \(settings.key) version \(version) (running relays adopt them at once)"
        }
        try LoginTokenFile.write(grant, to: TokenFile(path: tokenFilePath, codec: codecs.file))
        let watch = config.tokens.watchIntervalSeconds
        return "logged in; tokens written to \(tokenFilePath) (a running tokenrelay picks them up within \(watch == watch.rounded() ? String(Int(watch)) : String(watch)) s, no restart needed)"
    }

    private static func form(to endpoint: HTTPEndpoint, fields: [(String, String)], client: any ClientCredentialSource) throws -> TokenHTTPRequest {
        do {
            return try .oauthForm(to: endpoint, fields: fields, client: client)
        } catch {
            throw LoginError("client authentication: \(error.reason)")
        }
    }

    private static func requestCode(_ endpoint: BlockingHTTPClient, _ request: TokenHTTPRequest) throws -> DeviceAuthorization {
        switch endpoint.send(request) {
        case .failure(let failure):
            throw LoginError("device authorization endpoint: \(failure)")
        case .success(let response) where (200..<300).contains(response.status):
            return try DeviceAuthorization.parse(response.body)
        case .success(let response):
            // The same reading as a token endpoint error: status plus the registered error code only.
            if case .rejected(_, let code?) = TokenEndpointResult.classify(status: response.status, body: response.body) {
                throw LoginError("the device authorization endpoint refused the request: \(code) (HTTP \(response.status))")
            }
            throw LoginError("the device authorization endpoint answered HTTP \(response.status)")
        }
    }

    static func instructions(for authorization: DeviceAuthorization) -> [String] {
        var lines = ["To sign in, open \(authorization.verificationURI) and enter the code \(authorization.userCode)"]
        if let complete = authorization.verificationURIComplete {
            lines.append("(or open \(complete), which has the code filled in)")
        }
        lines.append("The code expires in \(TokenFileReport.duration(authorization.expiresIn)). Waiting for the sign-in to complete...")
        return lines
    }

    /// Polls every `interval` seconds (RFC 8628 §3.5): 5 s more after each `slow_down`, doubled after a
    /// transient failure (the exponential back-off the RFC asks for on timeouts), until tokens come, an
    /// error ends it, or the code expires locally.
    private static func pollForTokens(_ endpoint: BlockingHTTPClient, _ request: () throws -> TokenHTTPRequest, interval: Double, scale: Double,
                                      deadline: Double) throws -> TokenGrant {
        var interval = interval
        var transientFailures = 0
        while true {
            let wait = interval * scale
            // A poll after the code expired could only be answered expired_token.
            guard EventLoop.monotonicNow + wait < deadline else { throw LoginError("the code expired; run login again") }
            // Protocol pacing, not synchronisation: the server asked for this spacing.
            DetachedThread.sleep(seconds: wait)
            let result: TokenEndpointResult
            switch endpoint.send(try request()) {
            case .success(let response): result = TokenEndpointResult.classify(status: response.status, body: response.body)
            case .failure(let failure): result = .transient(reason: "token endpoint \(failure)", outcomeUnknown: failure.requestMayHaveReachedPeer)
            }
            switch DevicePollStep.classify(result) {
            case .granted(let grant):
                return grant
            case .pending:
                transientFailures = 0
            case .slowDown:
                transientFailures = 0
                interval += 5
            case .transient(let reason):
                transientFailures += 1
                guard transientFailures < maxTransientFailures else {
                    throw LoginError("giving up after \(transientFailures) failed polls in a row: \(reason)")
                }
                interval *= 2
            case .failed(let error):
                throw error
            }
        }
    }
}
