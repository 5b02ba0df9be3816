/// The `upstream` and `tokens` blocks, read the same way at the top level and inside `routes` and
/// `identities` (field paths come from the object, so an error names where it is).
extension ConfigLoader {
    static func readUpstream(_ object: JSONObjectReader) throws -> Config.Upstream {
        object.declareKeys(["url", "tls", "passthrough_prefixes", "http2"])
        let url = try HTTPEndpoint.parse(object.string("url"), field: object.fieldPath("url"))
        var upstream = Config.Upstream(url: url, tls: try TLSSettings.read(from: object, for: url))
        if let prefixes = try object.optionalStringArray("passthrough_prefixes") {
            if let index = prefixes.firstIndex(where: { !$0.hasPrefix("/") }) {
                throw ConfigError("\(object.fieldPath("passthrough_prefixes"))[\(index)]", "must start with /")
            }
            upstream.passthroughPrefixes = prefixes
        }
        upstream.http2 = try readHTTP2Mode(object, url: url)
        try object.rejectUnknownKeys()
        return upstream
    }

    /// `upstream.http2`: "never" (default), "prior_knowledge", "alpn" (https:// only: ALPN is a TLS extension).
    private static func readHTTP2Mode(_ object: JSONObjectReader, url: HTTPEndpoint) throws -> Config.Upstream.HTTP2Mode {
        guard let text = try object.optionalString("http2") else { return .never }
        guard let mode = Config.Upstream.HTTP2Mode(rawValue: text) else {
            let allowed = Config.Upstream.HTTP2Mode.allCases.map { "\"\($0.rawValue)\"" }.joined(separator: ", ")
            throw ConfigError(object.fieldPath("http2"), "must be one of \(allowed)")
        }
        if mode == .alpn && !url.usesTLS {
            throw ConfigError(object.fieldPath("http2"), "\"alpn\" needs an https:// upstream url (use \"prior_knowledge\" for h2c)")
        }
        return mode
    }

    static func readTokens(_ object: JSONObjectReader) throws -> Config.Tokens {
        object.declareKeys(["file", "redis", "watch_interval_seconds", "encryption"])
        var tokens = Config.Tokens(file: try object.optionalString("file"))
        tokens.redis = try RedisSettings.read(from: object)
        tokens.encryption = try TokenEncryptionSettings.read(from: object)
        if tokens.file == nil && tokens.redis == nil {
            let missing = object.missing("file")
            guard missing.description.hasSuffix("is required") else { throw missing }
            throw ConfigError(object.fieldPath("file"), "is required (or \(object.fieldPath("redis")), for a fleet sharing tokens in Redis)")
        }
        if let interval = try object.optionalNumber("watch_interval_seconds", range: 0.1...3600) {
            tokens.watchIntervalSeconds = interval
        }
        try object.rejectUnknownKeys()
        return tokens
    }
}
