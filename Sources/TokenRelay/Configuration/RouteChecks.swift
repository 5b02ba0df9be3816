import Glibc

/// What `routes` and `identities` must satisfy together, beyond each entry on its own. Each rule is a
/// one-line error naming the field, and for a clash both parties.
enum RouteChecks {
    /// Route and identity names become metric labels, URL path segments (`/readyz/NAME`) and query values:
    /// plain, short, and never in need of escaping.
    static func checkName(_ name: String, field: String, kind: String) throws {
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x30 && byte <= 0x39) || byte == 0x2D || byte == 0x5F || byte == 0x2E
        }
        guard allowed, (1...64).contains(name.utf8.count) else {
            throw ConfigError(field, "\"\(name.prefix(80))\" is not usable as \(kind) (1 to 64 of letters, digits, . _ -)")
        }
    }

    /// A Host field value as written in a config: name or address, with an optional port.
    static func isHostPattern(_ host: String) -> Bool {
        host.utf8.count <= 255 && host.utf8.allSatisfy { byte in
            (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x30 && byte <= 0x39)
                || byte == 0x2D || byte == 0x2E || byte == 0x3A || byte == 0x5B || byte == 0x5D
        }
    }

    /// Why `prefix` cannot be a `match.path_prefix`, or nil. The request path is compared byte for byte as
    /// it arrived, so a prefix must be spelt the way a normal request spells it: no query, no fragment, no
    /// percent-escapes (a client could spell the same path either way) and no dot segments (the upstream
    /// would resolve them after the match decided).
    static func pathPrefixProblem(_ prefix: String) -> String? {
        guard prefix.hasPrefix("/") else { return "must start with /" }
        guard prefix.utf8.count <= 1024 else { return "must be at most 1024 bytes" }
        if let byte = prefix.utf8.first(where: { $0 <= 0x20 || $0 >= 0x7F || $0 == 0x3F || $0 == 0x23 || $0 == 0x25 }) {
            return "must not contain \(byte == 0x3F ? "?" : byte == 0x23 ? "#" : byte == 0x25 ? "%" : "spaces, control or non-ASCII bytes")"
        }
        if prefix.split(separator: "/", omittingEmptySubsequences: false).contains(where: { $0 == "." || $0 == ".." }) {
            return "must not contain . or .. segments"
        }
        return nil
    }

    static func check(_ config: Config) throws {
        try checkRoutes(config)
        try checkSharedTokenState(config)
    }

    private static func checkRoutes(_ config: Config) throws {
        var firstByName: [String: Int] = [:]
        var firstByMatch: [Config.RouteMatch: Int] = [:]
        let identityNames = config.identities.map(\.name)
        var listeners: [(field: String, address: ListenAddress)] = [("listen", config.listen)]
        if let admin = config.admin { listeners.append(("admin.listen", admin.listen)) }
        for (index, route) in config.routes.enumerated() {
            let field = "routes[\(index)]"
            if let earlier = firstByName.updateValue(index, forKey: route.name) {
                throw ConfigError("\(field).name", "duplicate route name \"\(route.name)\" (also routes[\(earlier)].name)")
            }
            if route.identity == nil && !config.hasDefaultIdentity {
                throw ConfigError("\(field).identity", "is required: there are no top-level tokens and refresh for the route to use "
                    + "(identities: \(identityNames.joined(separator: ", ")))")
            }
            if let identity = route.identity, !identityNames.contains(identity) {
                let known = identityNames.isEmpty ? "no identities are configured" : "identities: \(identityNames.joined(separator: ", "))"
                throw ConfigError("\(field).identity", "unknown identity \"\(identity)\" (\(known))")
            }
            if let match = route.match {
                var key = match
                key.stripPrefix = false
                if let earlier = firstByMatch.updateValue(index, forKey: key) {
                    throw ConfigError("\(field).match", "matches the same requests as routes[\(earlier)].match")
                }
            }
            if let listen = route.listen {
                if let clash = listeners.first(where: { $0.address.overlaps(listen) }) {
                    throw ConfigError("\(field).listen", "must differ from \(clash.field) (\(listen) and \(clash.address) cannot both be bound)")
                }
                listeners.append(("\(field).listen", listen))
            }
        }
    }

    /// Two identities never share a token file or a Redis key: each rotates its refresh token on its own
    /// schedule, and two writers of one state would overwrite each other's rotation (and present one
    /// refresh token twice).
    private static func checkSharedTokenState(_ config: Config) throws {
        var owners: [(field: String, tokens: Config.Tokens)] = config.hasDefaultIdentity ? [("tokens", config.tokens)] : []
        owners += config.identities.map { ("identities.\($0.name).tokens", $0.tokens) }
        var files: [String: String] = [:]
        var keys: [(field: String, redis: RedisSettings)] = []
        for owner in owners {
            if let file = owner.tokens.file {
                let fileField = "\(owner.field).file"
                if let other = files.updateValue(fileField, forKey: canonicalPath(file)) {
                    throw ConfigError(fileField, "\(file) is also \(other); two identities never share a token file")
                }
            }
            if let redis = owner.tokens.redis {
                let keyField = "\(owner.field).redis.key"
                if let other = keys.first(where: { $0.redis.key == redis.key && sameServer($0.redis.endpoint, redis.endpoint) }) {
                    throw ConfigError(keyField, "\"\(redis.key)\" on \(redis.url) is also \(other.field); two identities never share a Redis key")
                }
                keys.append((keyField, redis))
            }
        }
    }

    /// Whether two token settings name the same state: one file, or one key on one Redis.
    static func sameTokenState(_ a: Config.Tokens, _ b: Config.Tokens) -> Bool {
        if let x = a.file, let y = b.file, canonicalPath(x) == canonicalPath(y) { return true }
        if let x = a.redis, let y = b.redis, x.key == y.key, sameServer(x.endpoint, y.endpoint) { return true }
        return false
    }

    private static func sameServer(_ a: RedisEndpoint, _ b: RedisEndpoint) -> Bool {
        a.address == b.address && a.database == b.database
    }

    /// One spelling per file: `.`/`..`/`//` resolved by text, then the directory's symbolic links by the
    /// file system when it exists (`check` runs where the relay will). Two spellings of one file must clash.
    static func canonicalPath(_ path: String) -> String {
        var parts: [Substring] = []
        for part in path.split(separator: "/") {
            if part == "." { continue }
            if part == ".." { if !parts.isEmpty { parts.removeLast() }; continue }
            parts.append(part)
        }
        let prefix = path.hasPrefix("/") ? "/" : ""
        let lexical = prefix + parts.joined(separator: "/")
        guard let name = parts.last else { return lexical }
        let directory = prefix + parts.dropLast().joined(separator: "/")
        guard let resolved = realpath(directory.isEmpty ? "." : directory, nil) else { return lexical }
        defer { free(resolved) }
        let base = String(cString: resolved)
        return (base == "/" ? "" : base) + "/" + name
    }
}
