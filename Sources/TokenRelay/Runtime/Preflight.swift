/// Everything that must hold before tokenrelay can serve: a valid config, the client secret where the
/// config says it is, and a readable, private, well-formed token file. `tokenrelay check` runs exactly
/// this, so a passing check means `run` will start (short of a busy port).
public struct Preflight {
    public let config: Config
    public let clientSecret: String?
    let tokens: TokenSet
    let tokenFile: TokenFile

    public static func run(configPath: String) throws -> Preflight {
        let config = try ConfigLoader.load(path: configPath)
        return try run(config: config)
    }

    public static func run(config: Config) throws -> Preflight {
        let secret = try SecretLoader.load(config.refresh.clientSecret)
        let file = TokenFile(path: config.tokens.file)
        try file.checkPermissions()
        let tokens = try file.load()
        return Preflight(config: config, clientSecret: secret, tokens: tokens, tokenFile: file)
    }

    /// One line for `check`, with no secret in it.
    public var summary: String {
        let expiry = tokens.expiresAt.map { "access token expires \(Timestamp.format($0))" } ?? "access token expiry unknown"
        let refresh = tokens.refreshToken == nil ? "no refresh token" : "refresh token present"
        return "ok: config valid; token file \(tokenFile.path): \(expiry), \(refresh)"
    }
}
