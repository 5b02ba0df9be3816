import FoundationEssentials
import Glibc

/// `token import`, `token show` and `login` when the config keeps tokens in Redis: the same
/// compare-and-set (and announcement) the relays use, so running relays adopt the new tokens at once.
enum RedisTokenCLI {
    static func endpoint(_ config: Config) throws -> (RedisEndpoint, RedisSettings)? {
        guard let settings = config.tokens.redis else { return nil }
        // With `sentinel`, the master the sentinels name now (asked in turn; blocking is fine here).
        return (try RedisSentinelTarget.resolveBlocking(settings: settings, endpoint: Preflight.redisEndpoint(settings)), settings)
    }

    /// Writes `tokens` as the next version (clearing "login required"), stamped as an import (`imported_at`,
    /// `RedisHeldSet`): relays adopt it even when its version is lower than one they hold (after a flush)
    /// instead of putting their older set back over it. Returns the version written.
    static func store(_ tokens: TokenSet, endpoint: RedisEndpoint, settings: RedisSettings, codec: TokenStateCodec = .plain) throws -> Int64 {
        let data = try codec.encode(tokens, expiryMilliseconds: true)
        let timeout = settings.commandTimeoutSeconds * 2
        // An import races only with a relay's refresh; a lost compare-and-set is tried again on the newer base.
        for _ in 0..<5 {
            let stored = try RedisOneShot.run(endpoint: endpoint, timeout: timeout, ["HMGET", settings.key, "version", "imported_at"])
            guard case .array(let fields) = stored, fields.count == 2 else { throw RedisStoreError(description: "unexpected reply from Redis") }
            let current = fields[0].integer ?? 0
            let stamp = RedisHeldSet.importStamp(now: Date(), stored: fields[1].integer)
            let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: settings.key + ":updates", expected: current,
                                                                tokens: data, loginRequired: "", writer: "tokenrelay-cli/\(getpid())",
                                                                importStamp: stamp)
            switch RedisScripts.compareAndSetOutcome(try RedisOneShot.run(endpoint: endpoint, timeout: timeout, arguments)) {
            case .written(let version): return version
            case .conflict: continue
            case .failed(let reason): throw RedisStoreError(description: reason)
            }
        }
        throw RedisStoreError(description: "Redis key \(settings.key) kept changing; nothing written")
    }

    static func show(endpoint: RedisEndpoint, settings: RedisSettings, codec: TokenStateCodec = .plain, now: Date) throws -> String {
        let replies = try RedisOneShot.runAll(endpoint: endpoint, timeout: settings.commandTimeoutSeconds * 2, [
            ["HMGET", settings.key, "version", "tokens", "login_required", "writer"].map { Data($0.utf8) },
            ["GET", settings.key + ":lock"].map { Data($0.utf8) },
        ])
        var lines = ["token store: Redis \(endpoint.description) key \(settings.key)"]
        guard replies.count == 2, case .array(let fields) = replies[0], fields.count == 4 else {
            throw RedisStoreError(description: "unexpected reply from Redis")
        }
        guard let version = fields[0].integer, case .string(let data) = fields[1] else {
            lines.append("no token set stored yet (tokenrelay token import writes one)")
            return lines.joined(separator: "\n")
        }
        let (tokens, form) = try codec.decodeWithForm(data, name: "redis:\(settings.key)")
        lines.append("version: \(version), written by \(fields[3].text ?? "unknown")")
        lines.append("stored: \(TokenFileReport.describe(form, codec: codec))")
        lines.append("access token: \(TokenFingerprint.of(tokens.accessToken))")
        lines.append("expires: \(TokenFileReport.describeExpiry(of: tokens, now: now))")
        lines.append("refresh token: \(tokens.refreshToken.map { "present (\(TokenFingerprint.of($0)))" } ?? "absent")")
        if let reason = fields[2].text, !reason.isEmpty { lines.append("login required: \(reason)") }
        lines.append("refresh lock: \(replies[1].text.map { "held by \($0)" } ?? "free")")
        return lines.joined(separator: "\n")
    }
}
