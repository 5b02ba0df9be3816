/// Reads the `refresh` object. What is required depends on the grant: the OAuth grants need a token URL
/// and an explicit client authentication; the custom grant carries its own request and may reference
/// the client id and secret through placeholders instead.
extension ConfigLoader {
    static func readRefresh(_ object: JSONObjectReader) throws -> Config.Refresh {
        object.declareKeys(["grant", "token_url", "client_id", "client_secret_env", "client_secret_file", "client_auth", "scope",
                            "audience", "resource", "request", "response", "max_attempts", "backoff_seconds", "trigger_statuses",
                            "proactive", "skew_seconds", "storm_max_refreshes", "storm_window_seconds", "tls"])
        let grantText = try object.string("grant")
        guard let grant = Config.Refresh.Grant(rawValue: grantText) else {
            let supported = Config.Refresh.Grant.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConfigError(object.fieldPath("grant"), "unsupported grant \"\(grantText)\" (supported: \(supported))")
        }
        try rejectKeys(grant == .custom ? ["token_url", "client_auth", "scope"] : ["request", "response"], in: object,
                       because: grant == .custom ? "is not used by the custom grant (see refresh.request)" : "is only used by the custom grant")
        if grant != .clientCredentials {
            try rejectKeys(["audience", "resource"], in: object, because: "is only used by the client_credentials grant")
        }
        let secret = try readSecretSource(object)
        var refresh: Config.Refresh
        if grant == .custom {
            let custom = try CustomGrantSettings.read(request: object.object("request"), response: object.object("response"))
            refresh = Config.Refresh(tokenURL: custom.url, clientID: try object.optionalString("client_id") ?? "",
                                     clientSecret: secret, clientAuth: .none)
            refresh.custom = custom
            try checkCustomCredentials(refresh, object)
        } else {
            refresh = try readOAuthClient(object, secret: secret)
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
        if let proactive = try object.optionalBool("proactive") { refresh.proactive = proactive }
        refresh.skewSeconds = try object.optionalNumber("skew_seconds", range: 0...3600)
        if let storm = try object.optionalInteger("storm_max_refreshes", range: 1...1000) { refresh.stormMaxRefreshes = storm }
        if let window = try object.optionalNumber("storm_window_seconds", range: 1...86_400) { refresh.stormWindowSeconds = window }
        refresh.tls = try TLSSettings.read(from: object, for: refresh.tokenURL)
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

    /// refresh_token and client_credentials: token URL, client id and an explicit client authentication
    /// that matches the presence of a secret.
    private static func readOAuthClient(_ object: JSONObjectReader, secret: Config.Refresh.SecretSource?) throws -> Config.Refresh {
        let tokenURL = try HTTPEndpoint.parse(object.string("token_url"), field: object.fieldPath("token_url"))
        let clientID = try object.string("client_id")
        let authText = try object.string("client_auth")
        guard let clientAuth = Config.Refresh.ClientAuth(rawValue: authText) else {
            let allowed = Config.Refresh.ClientAuth.allCases.map(\.rawValue).joined(separator: ", ")
            throw ConfigError(object.fieldPath("client_auth"), "must be one of \(allowed)")
        }
        if secret == nil, clientAuth != .none {
            throw ConfigError(object.fieldPath("client_secret_env"), "client_auth \(authText) needs client_secret_env or client_secret_file")
        }
        if clientAuth == .none, secret != nil {
            throw ConfigError(object.fieldPath("client_auth"), "is none, so no client secret may be configured")
        }
        return Config.Refresh(tokenURL: tokenURL, clientID: clientID, clientSecret: secret, clientAuth: clientAuth)
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
