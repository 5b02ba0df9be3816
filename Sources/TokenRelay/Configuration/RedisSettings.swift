import FoundationEssentials

/// `tokens.redis`: the shared store of a fleet of relays (one identity, one refresh at a time).
public struct RedisSettings: Sendable {
    /// Host and port, or a unix socket, and the database number (never credentials: those come from
    /// `username` and the password source).
    var endpoint: RedisEndpoint
    /// Everything tokenrelay stores lives under this key (`<key>`, `<key>:lock`, channel `<key>:updates`).
    public var key: String
    public var username: String?
    public var password: Config.Refresh.SecretSource?
    /// `tokens.redis.tls` for a `rediss://` URL (nil: the defaults, verified against the system CA store).
    public var tls: TLSSettings?
    /// Connect and per-command bound; an unanswered command closes the connection.
    public var commandTimeoutSeconds = 2.0
    /// How long the refresh lock lives unless released; nil: `timeouts.refresh_seconds` plus
    /// `defaultLockMarginCommands` command timeouts.
    public var lockSeconds: Double?
    /// How often the version is polled (see `RedisTokenStore.startPolling`).
    public var pollIntervalSeconds = 0.5
    /// Replicas that must have a new token set (Redis `WAIT`) before held requests are released; 0: the
    /// primary's acknowledgement suffices.
    public var waitReplicas = 0
    /// `tokens.redis.sentinel`: the master found through Redis Sentinel (then `endpoint` is only the
    /// template of the data nodes' login: database, username, password, TLS; its address is a placeholder
    /// naming the master, never connected to).
    public var sentinel: RedisSentinelSettings?

    /// How long a write may take: the compare-and-set, and `WAIT` (given half a command timeout, so it
    /// answers before the connection's own bound).
    var writeTimeoutSeconds: Double { commandTimeoutSeconds * (waitReplicas > 0 ? 1.5 : 1) }

    /// The lock must outlive one refresh (`refresh_seconds`) plus the commands around it under the lock
    /// (the re-read before, the compare-and-set after). Race it prevents: a lock that expires while its
    /// holder's refresh is still at the token server lets a second relay present the same refresh token.
    static let minimumLockMarginCommands = 2.0
    static let defaultLockMarginCommands = 5.0

    public var url: String { sentinel?.description ?? endpoint.description }

    /// The settings a reload cannot change, as one line for the restart notice: the connections, the
    /// subscription and the write path are set up with them at start. Never a password (only where it
    /// comes from). `lock_seconds` is not among them: the next lock taken uses the reloaded value.
    var restartOnlyDescription: String {
        let password: String
        switch self.password {
        case nil: password = "no password"
        case .environment(let name)?: password = "password_env \(name)"
        case .file(let path)?: password = "password_file \(path)"
        }
        return "\(url) key \(key) username \(username ?? "none") \(password) command_timeout_seconds \(Self.format(commandTimeoutSeconds)) "
            + "poll_interval_seconds \(Self.format(pollIntervalSeconds)) wait_replicas \(waitReplicas)" + tlsDescription
            + (sentinel.map { " sentinel username \($0.username ?? "none") password_env \($0.passwordEnv ?? "none")" } ?? "")
    }

    /// The TLS files and flags the connections were built with (paths only, never contents).
    private var tlsDescription: String {
        guard endpoint.usesTLS else { return "" }
        let tls = self.tls ?? TLSSettings()
        return " tls ca_file \(tls.caFile ?? "system") server_name \(tls.serverName ?? "url host") client_cert \(tls.clientCert ?? "none") "
            + "client_key \(tls.clientKey ?? "none") insecure_skip_verify \(tls.insecureSkipVerify)"
    }

    func effectiveLockSeconds(refreshSeconds: Double) -> Double {
        lockSeconds ?? refreshSeconds + Self.defaultLockMarginCommands * commandTimeoutSeconds
    }

    static func read(from tokens: JSONObjectReader) throws -> RedisSettings? {
        guard let object = try tokens.optionalObject("redis") else { return nil }
        object.declareKeys(["url", "sentinel", "db", "key", "username", "password_env", "password_file", "command_timeout_seconds", "lock_seconds",
                            "poll_interval_seconds", "wait_replicas", "tls"])
        let sentinel = try RedisSentinelSettings.read(from: object)
        let endpoint: RedisEndpoint
        switch (try object.optionalString("url"), sentinel) {
        case (let url?, nil):
            if object.has("db") { throw ConfigError(object.fieldPath("db"), "goes into the url (redis://host:port/db); db is for sentinel") }
            endpoint = try parseURL(url, field: object.fieldPath("url"))
        case (nil, let sentinel?):
            // The data nodes use TLS when `tokens.redis.tls` is given (there is no rediss:// to say so).
            endpoint = RedisEndpoint(address: .tcp(host: "sentinel:\(sentinel.master)", port: 0),
                                     database: try object.optionalInteger("db", range: 0...65535) ?? 0, usesTLS: object.has("tls"))
        case (_?, _?): throw ConfigError(object.fieldPath("sentinel"), "set either url or sentinel, not both")
        case (nil, nil): throw ConfigError(object.fieldPath("url"), "is required (or sentinel, to find the master through Redis Sentinel)")
        }
        let key = try object.string("key")
        if key.utf8.count > 256 || key.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7F }) {
            throw ConfigError(object.fieldPath("key"), "must be at most 256 bytes without spaces or control characters")
        }
        var settings = RedisSettings(endpoint: endpoint, key: key)
        settings.sentinel = sentinel
        settings.username = try object.optionalString("username")
        switch (try object.optionalString("password_env"), try object.optionalString("password_file")) {
        case (let name?, nil): settings.password = .environment(name)
        case (nil, let path?): settings.password = .file(path)
        case (_?, _?): throw ConfigError(object.fieldPath("password_file"), "set either password_env or password_file, not both")
        case (nil, nil): break
        }
        if settings.username != nil && settings.password == nil {
            throw ConfigError(object.fieldPath("username"), "needs password_env or password_file")
        }
        if let value = try object.optionalNumber("command_timeout_seconds", range: 0.05...60) { settings.commandTimeoutSeconds = value }
        settings.lockSeconds = try object.optionalNumber("lock_seconds", range: 0.1...86_400 * 2)
        if let value = try object.optionalNumber("poll_interval_seconds", range: 0.05...60) { settings.pollIntervalSeconds = value }
        if let value = try object.optionalInteger("wait_replicas", range: 0...64) { settings.waitReplicas = value }
        settings.tls = try TLSSettings.read(from: object, urlUsesTLS: endpoint.usesTLS, urlKind: "a rediss:// URL")
        try object.rejectUnknownKeys()
        return settings
    }

    /// The lock must outlive a refresh (checked once `timeouts` is read).
    func validateLock(refreshSeconds: Double) throws {
        guard let lockSeconds else { return }
        let minimum = refreshSeconds + Self.minimumLockMarginCommands * commandTimeoutSeconds
        if lockSeconds < minimum {
            throw ConfigError("tokens.redis.lock_seconds", "must be at least timeouts.refresh_seconds + 2 × command_timeout_seconds "
                              + "(\(Self.format(minimum)) s): the lock must outlive a refresh")
        }
    }

    /// `redis://host:port/db` (port 6379 and database 0 by default), `rediss://host:port/db` (the same
    /// over TLS) or `unix:///absolute/path`.
    static func parseURL(_ text: String, field: String) throws -> RedisEndpoint {
        let lower = text.lowercased()
        if lower.hasPrefix("unix://") {
            let path = String(text.dropFirst("unix://".count))
            guard path.hasPrefix("/"), path.count > 1 else { throw ConfigError(field, "unix:// needs an absolute socket path, e.g. unix:///run/redis/redis.sock") }
            guard path.utf8.count < 108 else { throw ConfigError(field, "the unix socket path is longer than 107 bytes") }
            return RedisEndpoint(address: .unix(path: path))
        }
        let usesTLS = lower.hasPrefix("rediss://")
        guard usesTLS || lower.hasPrefix("redis://") else {
            throw ConfigError(field, "must be a redis://host:port/db, rediss://host:port/db or unix:///path URL")
        }
        var rest = Substring(text.dropFirst(usesTLS ? "rediss://".count : "redis://".count))
        if rest.contains("@") {
            throw ConfigError(field, "must not carry credentials; use tokens.redis.username and password_env or password_file")
        }
        var database = 0
        if let slash = rest.firstIndex(of: "/") {
            let tail = rest[rest.index(after: slash)...]
            if !tail.isEmpty {
                guard let number = Int(tail), (0...65535).contains(number) else { throw ConfigError(field, "the database after / must be a number from 0 to 65535") }
                database = number
            }
            rest = rest[..<slash]
        }
        var host = rest
        var port = 6379
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { throw ConfigError(field, "an IPv6 host needs its closing ]") }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let number = Int(after.dropFirst()), (1...65535).contains(number) else {
                    throw ConfigError(field, "port must be a number from 1 to 65535")
                }
                port = number
            }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            guard let number = Int(rest[rest.index(after: colon)...]), (1...65535).contains(number) else {
                throw ConfigError(field, "port must be a number from 1 to 65535")
            }
            port = number
        }
        guard !host.isEmpty, !host.contains(where: { $0 == "?" || $0 == "#" || $0.isWhitespace }) else { throw ConfigError(field, "must name a host") }
        return RedisEndpoint(address: .tcp(host: String(host), port: port), database: database, usesTLS: usesTLS)
    }

    private static func format(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(value)
    }
}
