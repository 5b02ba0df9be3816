/// Reads the `refresh` object. What is required depends on the grant: the OAuth grants need a token URL
/// and an explicit client authentication; the custom grant carries its own request and may reference
/// the client id and secret through placeholders instead.
extension ConfigLoader {
    static func readRefresh(_ object: JSONObjectReader) throws -> Config.Refresh {
        object.declareKeys(["grant", "token_url", "client_id", "client_secret_env", "client_secret_file", "client_auth", "scope",
                            "audience", "resource", "request", "response", "max_attempts", "backoff_seconds", "trigger_statuses",
                            "trigger_grpc_statuses",
                            "proactive", "skew_seconds", "storm_max_refreshes", "storm_window_seconds", "tls", "assertion"]
                           + clientAssertionKeys + tokenExchangeKeys)
        let grantText = try object.string("grant")
        guard let grant = Config.Refresh.Grant(rawValue: grantText) else {
            let supported = Config.Refresh.Grant.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConfigError(object.fieldPath("grant"), "unsupported grant \"\(grantText)\" (supported: \(supported))")
        }
        try rejectKeys(grant == .custom ? ["token_url", "client_auth", "scope"] : ["request", "response"], in: object,
                       because: grant == .custom ? "is not used by the custom grant (see refresh.request)" : "is only used by the custom grant")
        if grant != .clientCredentials && grant != .tokenExchange {
            try rejectKeys(["audience", "resource"], in: object, because: "is only used by the client_credentials and token_exchange grants")
        }
        if grant != .jwtBearer { try rejectKeys(["assertion"], in: object, because: "is only used by the jwt_bearer grant") }
        if grant != .tokenExchange { try rejectKeys(tokenExchangeKeys, in: object, because: "is only used by the token_exchange grant") }
        let secret = try readSecretSource(object)
        var refresh: Config.Refresh
        if grant == .custom {
            let custom = try CustomGrantSettings.read(request: object.object("request"), response: object.object("response"))
            refresh = Config.Refresh(tokenURL: custom.url, clientID: try object.optionalString("client_id") ?? "",
                                     clientSecret: secret, clientAuth: .none)
            refresh.custom = custom
            try checkCustomCredentials(refresh, object)
        } else {
            refresh = try readOAuthClient(object, grant: grant, secret: secret)
        }
        if refresh.clientAuth != .privateKeyJWT {
            try rejectKeys(clientAssertionKeys, in: object, because: "is only used with client_auth private_key_jwt")
        }
        refresh.grant = grant
        refresh.scope = try object.optionalString("scope")
        refresh.audience = try object.optionalString("audience")
        refresh.resource = try object.optionalString("resource")
        if let attempts = try object.optionalInteger("max_attempts", range: 1...20) { refresh.maxAttempts = attempts }
        if let backoff = try object.optionalNumber("backoff_seconds", range: 0.01...60) { refresh.backoffSeconds = backoff }
        if let statuses = try object.optionalIntegerArray("trigger_statuses", range: 400...499) {
            refresh.triggerStatuses = Set(statuses).union([401])
        }
        if let statuses = try object.optionalIntegerArray("trigger_grpc_statuses", range: 1...16) {
            refresh.triggerGRPCStatuses = Set(statuses).union([16])
        }
        if let proactive = try object.optionalBool("proactive") { refresh.proactive = proactive }
        refresh.skewSeconds = try object.optionalNumber("skew_seconds", range: 0...3600)
        if let storm = try object.optionalInteger("storm_max_refreshes", range: 1...1000) { refresh.stormMaxRefreshes = storm }
        if let window = try object.optionalNumber("storm_window_seconds", range: 1...86_400) { refresh.stormWindowSeconds = window }
        refresh.tls = try TLSSettings.read(from: object, for: refresh.tokenURL)
        if refresh.clientAuth == .tlsClientAuth, refresh.tls?.clientCert == nil {
            let field = refresh.tokenURL.usesTLS ? object.fieldPath("tls.client_cert") : object.fieldPath("token_url")
            throw ConfigError(field, refresh.tokenURL.usesTLS ? "is required by client_auth tls_client_auth (with tls.client_key)"
                                                              : "must be https:// for client_auth tls_client_auth (the client certificate authenticates)")
        }
        try object.rejectUnknownKeys()
        return refresh
    }

    private static func rejectKeys(_ keys: [String], in object: JSONObjectReader, because reason: String) throws {
        if let key = keys.first(where: object.has) { throw ConfigError(object.fieldPath(key), reason) }
    }

    private static func readSecretSource(_ object: JSONObjectReader) throws -> Config.Refresh.SecretSource? {
        switch (try object.optionalString("client_secret_env"), try object.optionalString("client_secret_file")) {
        case let (env?, nil): return .environment(env)
        case let (nil, file?): return .file(file)
        case (nil, nil): return nil
        case (_?, _?): throw ConfigError(object.fieldPath("client_secret_file"), "set either client_secret_env or client_secret_file, not both")
        }
    }

    /// The OAuth grants: token URL, client id and an explicit client authentication that matches the
    /// presence of a secret. jwt_bearer and token_exchange may leave the client unauthenticated (the
    /// assertion or the subject token is what counts): their client_auth defaults to none, and with none
    /// the client id is optional.
    private static func readOAuthClient(_ object: JSONObjectReader, grant: Config.Refresh.Grant,
                                        secret: Config.Refresh.SecretSource?) throws -> Config.Refresh {
        let tokenURLText = try object.string("token_url")
        let tokenURL = try HTTPEndpoint.parse(tokenURLText, field: object.fieldPath("token_url"))
        let authOptional = grant == .jwtBearer || grant == .tokenExchange
        let authText = authOptional ? try object.optionalString("client_auth") ?? "none" : try object.string("client_auth")
        guard let clientAuth = Config.Refresh.ClientAuth(rawValue: authText) else {
            let allowed = Config.Refresh.ClientAuth.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConfigError(object.fieldPath("client_auth"), "must be one of \(allowed)")
        }
        let clientID = authOptional && clientAuth == .none ? try object.optionalString("client_id") ?? "" : try object.string("client_id")
        let usesSecret = clientAuth == .clientSecretBasic || clientAuth == .clientSecretPost
        if secret == nil, usesSecret {
            throw ConfigError(object.fieldPath("client_secret_env"), "client_auth \(authText) needs client_secret_env or client_secret_file")
        }
        if !usesSecret, secret != nil {
            throw ConfigError(object.fieldPath("client_auth"), "is \(authText), so no client secret may be configured")
        }
        var refresh = Config.Refresh(tokenURL: tokenURL, clientID: clientID, clientSecret: secret, clientAuth: clientAuth)
        if clientAuth == .privateKeyJWT { refresh.clientAssertion = try readClientAssertion(object, tokenURL: tokenURLText) }
        switch grant {
        case .jwtBearer: refresh.assertion = try readAssertionGrant(object.object("assertion"), tokenURL: tokenURLText)
        case .tokenExchange: refresh.tokenExchange = try readTokenExchange(object)
        default: break
        }
        return refresh
    }

    /// A custom request that references the client id or secret needs them configured.
    private static func checkCustomCredentials(_ refresh: Config.Refresh, _ object: JSONObjectReader) throws {
        let used = refresh.custom?.placeholders ?? []
        if used.contains(.clientID), refresh.clientID.isEmpty {
            throw ConfigError(object.fieldPath("client_id"), "is required: refresh.request uses {{client_id}}")
        }
        if used.contains(.clientSecret), refresh.clientSecret == nil {
            throw ConfigError(object.fieldPath("client_secret_env"), "refresh.request uses {{client_secret}}: set client_secret_env or client_secret_file")
        }
    }
}
