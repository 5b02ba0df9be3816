/// Reads `routes` and `identities` and checks them against each other and the top level (`RouteChecks`).
extension ConfigLoader {
    static func readRoutesAndIdentities(_ root: JSONObjectReader, into config: inout Config) throws {
        if let object = try root.optionalObject("identities") {
            config.identities = try object.keys.map { name in
                try readIdentity(name: name, object.object(name), timeouts: config.timeouts)
            }
            try object.rejectUnknownKeys()
        }
        if let value = root.optionalValue("routes") {
            guard let array = value as? [Any] else { throw ConfigError("routes", "must be an array of route objects") }
            config.routes = try array.indices.map { index in
                try readRoute(JSONObjectReader(array[index], path: "routes[\(index)]"))
            }
        }
        try RouteChecks.check(config)
    }

    /// The top-level `upstream`, required unless `routes` has a route; without it the first route's
    /// upstream stands in (`Config.upstream`) and `configured` is false.
    static func readDefaultUpstream(_ root: JSONObjectReader) throws -> (settings: Config.Upstream, configured: Bool) {
        if let value = root.optionalValue("upstream") { return (try readUpstream(JSONObjectReader(value, path: "upstream")), true) }
        guard let routes = root.optionalValue("routes") as? [Any], let first = routes.first as? [String: Any],
              let upstream = first["upstream"] else {
            // A misspelt `upstream` (or another unknown key) is the likelier mistake, named first as for any key.
            let missing = root.missing("upstream")
            guard missing.field == "upstream" else { throw missing }
            throw ConfigError("upstream", "is required unless routes has a route (then a request matching no route gets 404)")
        }
        // Read again with the route's own field path, so a fault in it names routes[0].upstream.
        return (try readUpstream(JSONObjectReader(upstream, path: "routes[0].upstream")), false)
    }

    private static func readIdentity(name: String, _ object: JSONObjectReader, timeouts: Config.Timeouts) throws -> Config.Identity {
        try RouteChecks.checkName(name, field: object.path, kind: "an identity name")
        if name == Config.defaultIdentityName {
            throw ConfigError(object.path, "\"\(name)\" names the top-level identity (tokens, refresh) in metrics; choose another name")
        }
        object.declareKeys(["tokens", "refresh", "login", "dpop"])
        let tokens = try readTokens(object.object("tokens"))
        let refresh = try readRefresh(object.object("refresh"))
        let login = try LoginSettings.read(from: object, refresh: refresh)
        let dpop = try DPoPSettings.read(from: object)
        try tokens.redis?.validateLock(refreshSeconds: timeouts.refreshSeconds)
        try object.rejectUnknownKeys()
        return Config.Identity(name: name, tokens: tokens, refresh: refresh, login: login, dpop: dpop)
    }

    private static func readRoute(_ object: JSONObjectReader) throws -> Config.Route {
        object.declareKeys(["name", "listen", "match", "upstream", "identity", "inject", "max_held_requests"])
        let name = try object.string("name")
        try RouteChecks.checkName(name, field: object.fieldPath("name"), kind: "a route name")
        if name == Config.defaultRouteName {
            throw ConfigError(object.fieldPath("name"), "\"\(name)\" names the top-level route in metrics; choose another name")
        }
        let listen = try object.optionalString("listen").map { try ListenAddress.parse($0, field: object.fieldPath("listen")) }
        let match = try object.optionalObject("match").map(readMatch)
        switch (listen, match) {
        case (nil, nil): throw ConfigError(object.path, "needs listen (its own listener) or match (host and/or path_prefix on the main listener)")
        case (_?, _?): throw ConfigError(object.fieldPath("match"), "a route with its own listen takes everything arriving there; set listen or match, not both")
        default: break
        }
        let upstream = try readUpstream(object.object("upstream"))
        let identity = try object.optionalString("identity")
        let inject = object.has("inject") ? try InjectSettings.read(from: object) : nil
        let maxHeld = try object.optionalInteger("max_held_requests", range: 1...1_000_000)
        try object.rejectUnknownKeys()
        return Config.Route(name: name, listen: listen, match: match, upstream: upstream, identity: identity, inject: inject,
                            maxHeldRequests: maxHeld)
    }

    private static func readMatch(_ object: JSONObjectReader) throws -> Config.RouteMatch {
        object.declareKeys(["host", "path_prefix", "strip_prefix"])
        var match = Config.RouteMatch()
        if let host = try object.optionalString("host") {
            guard RouteChecks.isHostPattern(host) else {
                throw ConfigError(object.fieldPath("host"), "must be a host name or address, optionally with :port (letters, digits, . - [ ] :)")
            }
            match.host = host.lowercased()
        }
        if let prefix = try object.optionalString("path_prefix") {
            if let problem = RouteChecks.pathPrefixProblem(prefix) { throw ConfigError(object.fieldPath("path_prefix"), problem) }
            match.pathPrefix = prefix
        }
        if let strip = try object.optionalBool("strip_prefix") {
            guard match.pathPrefix != nil || !strip else { throw ConfigError(object.fieldPath("strip_prefix"), "needs path_prefix") }
            match.stripPrefix = strip
        }
        guard match.host != nil || match.pathPrefix != nil else { throw ConfigError(object.path, "needs host and/or path_prefix") }
        try object.rejectUnknownKeys()
        return match
    }
}
