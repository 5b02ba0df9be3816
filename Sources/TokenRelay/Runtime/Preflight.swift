import FoundationEssentials
import HTTPTransport

/// Everything that must hold before tokenrelay can serve: a valid config, loadable TLS material (CA
/// bundles, client certificates and keys), the client secret where the config says it is, and a
/// readable, private, well-formed token file. `tokenrelay check` runs exactly
/// this, so a passing check means `run` will start (short of a busy port).
public struct Preflight {
    public let config: Config
    public let clientSecret: String?
    /// The private keys `refresh` signs with (private_key_jwt, jwt_bearer), loaded and checked here.
    let credentialKeys: CredentialKeys
    var tokens: TokenSet
    /// How the token file held `tokens` (nil: nothing was read); plain or with a previous key, `run`
    /// rewrites it sealed at start when `tokens.encryption` is configured.
    var tokenForm: StoredTokenForm?
    /// The token state's (de)serialisation with `tokens.encryption`'s keys, loaded here.
    let codecs: ConfiguredTokenCodecs
    /// The token file; with `tokens.redis` the optional local cache.
    let tokenFile: TokenFile?
    /// Where the Redis store is, with its password resolved (fleet mode).
    let redis: RedisEndpoint?
    /// One TLS context per https target, built here so that a bad file fails `check` too.
    let upstreamTLS: TLSContext?
    let refreshTLS: TLSContext?
    /// The TLS context of each `routes[]` upstream, in route order (nil for http://).
    var routeUpstreamTLS: [TLSContext?] = []
    /// Each of `identities`, checked as the top level is (its token file or Redis, secret, keys, TLS).
    var identities: [NamedPreflight] = []

    public static func run(configPath: String) throws -> Preflight {
        let config = try ConfigLoader.load(path: configPath)
        return try run(config: config)
    }

    public static func run(config: Config) throws -> Preflight {
        let routeTLS = try config.routes.indices.map { index in
            try tlsContext(for: config.routes[index].upstream.url, settings: config.routes[index].upstream.tls, field: "routes[\(index)].upstream.tls")
        }
        var preflight = try runTopLevel(config: config)
        preflight.routeUpstreamTLS = routeTLS
        preflight.identities = try config.identities.map { identity in
            do {
                return NamedPreflight(name: identity.name, preflight: try runTopLevel(config: config.scoped(to: identity)))
            } catch let error as ConfigError {
                throw error.underIdentity(identity.name)
            }
        }
        return preflight
    }

    private static func runTopLevel(config: Config) throws -> Preflight {
        let upstreamTLS = try tlsContext(for: config.upstream.url, settings: config.upstream.tls, field: "upstream.tls")
        guard config.hasDefaultIdentity else {
            // No top-level identity: nothing of `tokens` or `refresh` is read (they only stand in, see Config).
            return Preflight(config: config, clientSecret: nil, credentialKeys: .none, tokens: TokenSet(accessToken: ""), tokenForm: nil,
                             codecs: try ConfiguredTokenCodecs(config.tokens), tokenFile: nil, redis: nil, upstreamTLS: upstreamTLS, refreshTLS: nil)
        }
        let refreshTLS = try tlsContext(for: config.refresh.tokenURL, settings: config.refresh.tls, field: "refresh.tls")
        let secret = try SecretLoader.load(config.refresh.clientSecret)
        let keys = try CredentialKeys.load(config.refresh)
        let codecs = try ConfiguredTokenCodecs(config.tokens)
        if let dpop = config.dpop, dpop.keyFile != nil {
            // A key of the wrong type for dpop.alg, or an unreadable one, fails check (the file read is before the loop).
            var none = TokenSet(accessToken: "")
            _ = try DPoPKeySource.load(dpop, tokens: &none, generate: false)
        }
        if let redisSettings = config.tokens.redis {
            return try run(config: config, redis: redisSettings, secret: secret, keys: keys, codecs: codecs, upstreamTLS: upstreamTLS, refreshTLS: refreshTLS)
        }
        let file = TokenFile(path: try config.tokens.requireFile(for: "tokenrelay run"), codec: codecs.file)
        let tokens: TokenSet
        var form: StoredTokenForm?
        if !config.refresh.needsRefreshToken && file.isAbsentOrEmpty {
            // client_credentials (or a custom grant without {{refresh_token}}) can get its first token by
            // itself: the coordinator fetches one at start and writes the file.
            tokens = TokenSet(accessToken: "")
        } else {
            try file.checkPermissions()
            (tokens, form) = try file.loadWithForm()
        }
        return Preflight(config: config, clientSecret: secret, credentialKeys: keys, tokens: tokens, tokenForm: form, codecs: codecs, tokenFile: file, redis: nil,
                         upstreamTLS: upstreamTLS, refreshTLS: refreshTLS)
    }

    /// Fleet mode: the tokens come from Redis once connected (on the event loop, never here). A local
    /// cache file, when configured and usable, gives the tokens to serve with until then; a cache that is
    /// missing or unusable is only a warning at start (Redis is the store), but never relaxed: a cache
    /// others can read is refused like a token file.
    private static func run(config: Config, redis settings: RedisSettings, secret: String?, keys: CredentialKeys, codecs: ConfiguredTokenCodecs,
                            upstreamTLS: TLSContext?, refreshTLS: TLSContext?) throws -> Preflight {
        let endpoint = try redisEndpoint(settings)
        let cache = config.tokens.file.map { TokenFile(path: $0, codec: codecs.file) }
        var tokens = TokenSet(accessToken: "")
        var form: StoredTokenForm?
        if let cache, !cache.isAbsentOrEmpty {
            try cache.checkPermissions()
            (tokens, form) = try cache.loadWithForm()
        }
        return Preflight(config: config, clientSecret: secret, credentialKeys: keys, tokens: tokens, tokenForm: form, codecs: codecs, tokenFile: cache, redis: endpoint,
                         upstreamTLS: upstreamTLS, refreshTLS: refreshTLS)
    }

    /// The endpoint the Redis connections use: the URL's address with the login (the password read from
    /// its source) and, for `rediss://`, the TLS context built from `tokens.redis.tls` (a bad file fails here,
    /// so `check` reports it).
    static func redisEndpoint(_ settings: RedisSettings) throws -> RedisEndpoint {
        var endpoint = settings.endpoint
        endpoint.username = settings.username
        endpoint.password = try loadRedisPassword(settings.password)
        // The sentinels' password and TLS files are checked here too (`check` reports a bad one).
        _ = try RedisSentinelTarget.build(settings: settings, dataNode: endpoint)
        if endpoint.usesTLS {
            let field = "tokens.redis.tls"
            let tls = settings.tls ?? TLSSettings()
            do {
                let context = try TransportTLSClientContext(caFile: tls.caFile, clientCertificateFile: tls.clientCert, clientKeyFile: tls.clientKey,
                                                            verifyPeer: !tls.insecureSkipVerify, serverName: tls.serverName)
                endpoint.tls = RedisTLS(context: context, field: field)
            } catch {
                throw ConfigError(field, error.description)
            }
        }
        return endpoint
    }

    static func loadRedisPassword(_ source: Config.Refresh.SecretSource?) throws -> String? {
        switch source {
        case nil: return nil
        case .environment(let name)?:
            guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else {
                throw ConfigError("tokens.redis.password_env", "environment variable \(name) is not set or empty")
            }
            return value
        case .file(let path)?:
            guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else {
                throw ConfigError("tokens.redis.password_file", "cannot read \(path) as UTF-8 text")
            }
            let password = text.trimmingNewlines()
            guard !password.isEmpty else { throw ConfigError("tokens.redis.password_file", "\(path) is empty") }
            return password
        }
    }

    /// The TLS context for an https target (nil for http), built at start so bad files fail `check`.
    static func tlsContext(for endpoint: HTTPEndpoint, settings: TLSSettings?, field: String) throws -> TLSContext? {
        guard endpoint.usesTLS else { return nil }
        return try TLSContext(settings: settings ?? TLSSettings(), field: field)
    }

    /// Config paths of targets whose certificates are not verified (each is logged as a warning).
    public var unverifiedTLSTargets: [String] {
        let redis = config.tokens.redis.flatMap { $0.endpoint.usesTLS && $0.tls?.insecureSkipVerify == true ? ["tokens.redis.tls.insecure_skip_verify"] : nil }
        let named = identities.flatMap { identity in identity.preflight.unverifiedTLSTargets.filter { !$0.hasPrefix("upstream") }.map { "identities.\(identity.name).\($0)" } }
        return named + ([upstreamTLS, refreshTLS] + routeUpstreamTLS).compactMap { $0 }.filter(\.settings.insecureSkipVerify).map { "\($0.field).insecure_skip_verify" } + (redis ?? [])
    }

    /// With `tokens.encryption`: how the file is stored now and what `run` does about it (a key id, never a key).
    private var sealingSummary: String {
        guard let codec = tokenFile?.codec, codec.sealer != nil, let form = tokenForm else { return "" }
        switch form {
        case .plain: return " (plain JSON: run seals it at start)"
        case .sealed(let keyID): return codec.needsResealing(form) ? " (sealed with the previous key \(keyID): run reseals it at start)" : " (sealed, key id \(keyID))"
        }
    }

    /// One line for `check`, with no secret in it.
    public var summary: String {
        storeSummary + dpopWarnings.map { "; WARNING: \($0)" }.joined()
            + (config.heldRequestShareWarning.map { "; WARNING: \($0)" } ?? "")
    }

    /// `dpop` without `key_file` and without `tokens.encryption`, at the top level or for an identity: the
    /// generated key is stored as readable PEM (`run` logs the same line at start).
    var dpopWarnings: [String] {
        [Relay.clearKeyWarning(config)].compactMap { $0 }
            + identities.compactMap { named in Relay.clearKeyWarning(named.preflight.config).map { "identities.\(named.name): \($0)" } }
    }

    private var storeSummary: String {
        guard config.hasDefaultIdentity else {
            return "ok: config valid; no top-level identity, each route names one of identities \(identities.map(\.name).joined(separator: ", "))"
                + unverifiedTLSTargets.map { "; WARNING: TLS certificates not verified (\($0))" }.joined()
        }
        if let redis = config.tokens.redis {
            let cache = tokenFile.map { file in
                tokens.accessToken.isEmpty ? "; cache \(file.path): empty" : "; cache \(file.path): access token "
                    + (tokens.expiresAt.map { "expires \(Timestamp.format($0))" } ?? "expiry unknown")
            } ?? ""
            return "ok: config valid; tokens in Redis \(redis.url) key \(redis.key) (not contacted by check)\(cache)"
                + unverifiedTLSTargets.map { "; WARNING: TLS certificates not verified (\($0))" }.joined()
        }
        guard let tokenFile else { return "ok: config valid" }
        if tokens.accessToken.isEmpty {
            return "ok: config valid; token file \(tokenFile.path): no token yet, one is fetched from the token endpoint at start"
                + unverifiedTLSTargets.map { "; WARNING: TLS certificates not verified (\($0))" }.joined()
        }
        let expiry = tokens.expiresAt.map { "access token expires \(Timestamp.format($0))" } ?? "access token expiry unknown"
        let refresh = tokens.refreshToken == nil ? "no refresh token" : "refresh token present"
        let unverified = unverifiedTLSTargets.map { "; WARNING: TLS certificates not verified (\($0))" }.joined()
        let clamped = TokenExpiry.clampWarning(for: tokens, now: Date()).map { "; WARNING: \($0)" } ?? ""
        return "ok: config valid; token file \(tokenFile.path)\(sealingSummary): \(expiry), \(refresh)\(unverified)\(clamped)"
    }
}

/// A named identity's preflight (`Preflight.identities`). A class: a struct cannot hold itself.
final class NamedPreflight: @unchecked Sendable { // @unchecked: handed over whole like the Preflight holding it; changed only
    // by `loadDPoPKey`, before it is handed to the loop
    let name: String
    var preflight: Preflight
    /// `identities.<name>.dpop`'s key, once loaded (`loadDPoPKey`).
    var dpopKey: DPoPKeySource?

    init(name: String, preflight: Preflight) {
        self.name = name
        self.preflight = preflight
    }
}
