import Foundation

/// Everything that must hold before tokenrelay can serve: a valid config, loadable TLS material (CA
/// bundles, client certificates and keys), the client secret where the config says it is, and a
/// readable, private, well-formed token file. `tokenrelay check` runs exactly
/// this, so a passing check means `run` will start (short of a busy port).
public struct Preflight {
    public let config: Config
    public let clientSecret: String?
    let tokens: TokenSet
    let tokenFile: TokenFile
    /// One TLS context per https target, built here so that a bad file fails `check` too.
    let upstreamTLS: TLSContext?
    let refreshTLS: TLSContext?

    public static func run(configPath: String) throws -> Preflight {
        let config = try ConfigLoader.load(path: configPath)
        return try run(config: config)
    }

    public static func run(config: Config) throws -> Preflight {
        let upstreamTLS = try tlsContext(for: config.upstream.url, settings: config.upstream.tls, field: "upstream.tls")
        let refreshTLS = try tlsContext(for: config.refresh.tokenURL, settings: config.refresh.tls, field: "refresh.tls")
        let secret = try SecretLoader.load(config.refresh.clientSecret)
        let file = TokenFile(path: config.tokens.file)
        let tokens: TokenSet
        if !config.refresh.needsRefreshToken && file.isAbsentOrEmpty {
            // client_credentials (or a custom grant without {{refresh_token}}) can get its first token by
            // itself: the coordinator fetches one at start and writes the file.
            tokens = TokenSet(accessToken: "")
        } else {
            try file.checkPermissions()
            tokens = try file.load()
        }
        return Preflight(config: config, clientSecret: secret, tokens: tokens, tokenFile: file,
                         upstreamTLS: upstreamTLS, refreshTLS: refreshTLS)
    }

    /// The TLS context for an https target (nil for http), built at start so bad files fail `check`.
    static func tlsContext(for endpoint: HTTPEndpoint, settings: TLSSettings?, field: String) throws -> TLSContext? {
        guard endpoint.usesTLS else { return nil }
        return try TLSContext(settings: settings ?? TLSSettings(), host: endpoint.host, field: field)
    }

    /// Config paths of targets whose certificates are not verified (each is logged as a warning).
    public var unverifiedTLSTargets: [String] {
        [upstreamTLS, refreshTLS].compactMap { $0 }.filter(\.settings.insecureSkipVerify).map { "\($0.field).insecure_skip_verify" }
    }

    /// One line for `check`, with no secret in it.
    public var summary: String {
        if tokens.accessToken.isEmpty {
            return "ok: config valid; token file \(tokenFile.path): no token yet, one is fetched from the token endpoint at start"
                + unverifiedTLSTargets.map { "; WARNING: TLS certificates not verified (\($0))" }.joined()
        }
        let expiry = tokens.expiresAt.map { "access token expires \(Timestamp.format($0))" } ?? "access token expiry unknown"
        let refresh = tokens.refreshToken == nil ? "no refresh token" : "refresh token present"
        let unverified = unverifiedTLSTargets.map { "; WARNING: TLS certificates not verified (\($0))" }.joined()
        let clamped = TokenExpiry.clampWarning(for: tokens, now: Date()).map { "; WARNING: \($0)" } ?? ""
        return "ok: config valid; token file \(tokenFile.path): \(expiry), \(refresh)\(unverified)\(clamped)"
    }
}
