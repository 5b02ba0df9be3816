import FoundationEssentials
import Glibc

/// Turns the JSON config file into a validated `Config`, or a `ConfigError` naming the field.
public enum ConfigLoader {
    public static func load(path: String) throws -> Config {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigError("", "cannot read config file \(path): \(String(cString: strerror(errno)))")
        }
        return try parse(data, source: path)
    }

    public static func parse(_ data: Data, source: String = "config") throws -> Config {
        let json: Any
        do {
            json = try StrictJSON.parse(data)
        } catch .malformed(let error) {
            throw ConfigError("", "\(source) is not valid JSON: \(error)")
        } catch .violation(let violation) {
            switch violation.kind {
            case .trailingComma: throw ConfigError("", "\(source) is not valid JSON: \(violation)")
            case .duplicateKey(let path): throw ConfigError(path, "duplicate key at line \(violation.line)")
            }
        }
        let root = try JSONObjectReader(json, path: "")
        let config = try readRoot(root)
        try root.rejectUnknownKeys()
        return config
    }

    private static func readRoot(_ root: JSONObjectReader) throws -> Config {
        root.declareKeys(["listen", "upstream", "tokens", "refresh", "admin", "login", "inject", "limits", "timeouts", "forwarding", "log", "data_plane", "routes", "identities", "dpop"])
        let listen = try ListenAddress.parse(root.string("listen"), field: "listen")

        // Without a top-level upstream, the routes are all there is: a request none matches gets 404.
        let upstream = try readDefaultUpstream(root)

        // Without top-level tokens, when every route names an identity, there is no default identity.
        let identity = try readDefaultIdentity(root, hasDefaultRoute: upstream.configured)
        let (tokens, refresh) = (identity.tokens, identity.refresh)

        var admin: Config.Admin?
        if let adminObject = try root.optionalObject("admin") {
            adminObject.declareKeys(["listen", "token_file"])
            let adminListen = try ListenAddress.parse(adminObject.string("listen"), field: "admin.listen")
            // Both listeners bind at start; the second would fail with "Address already in use", after check said ok.
            if adminListen.overlaps(listen) {
                throw ConfigError("admin.listen", "must differ from listen (\(adminListen) and \(listen) cannot both be bound)")
            }
            admin = Config.Admin(listen: adminListen)
            if let tokenFile = try adminObject.optionalString("token_file") {
                guard !tokenFile.isEmpty else { throw ConfigError("admin.token_file", "must not be empty") }
                admin?.tokenFile = tokenFile
            }
            try adminObject.rejectUnknownKeys()
        }

        var config = Config(listen: listen, upstream: upstream.settings, tokens: tokens, refresh: refresh, admin: admin)
        config.hasDefaultRoute = upstream.configured
        config.hasDefaultIdentity = identity.configured
        config.inject = try InjectSettings.read(from: root)
        config.dpop = try DPoPSettings.read(from: root)
        config.login = try LoginSettings.read(from: root, refresh: refresh)
        if let limits = try root.optionalObject("limits") {
            config.limits = try readLimits(limits)
        }
        if let timeouts = try root.optionalObject("timeouts") {
            config.timeouts = try readTimeouts(timeouts)
        }
        try config.tokens.redis?.validateLock(refreshSeconds: config.timeouts.refreshSeconds)
        if let engine = try root.optionalString("data_plane") {
            guard let parsed = Config.DataPlane(rawValue: engine) else { throw ConfigError("data_plane", "must be evhttp or transport") }
            config.dataPlane = parsed
        }
        if let forwarding = try root.optionalObject("forwarding") {
            config.forwarding = try readForwarding(forwarding)
        }
        if let log = try root.optionalObject("log") {
            if let level = try log.optionalString("level") {
                guard ["trace", "debug", "info", "notice", "warning", "error", "critical"].contains(level) else {
                    throw ConfigError(log.fieldPath("level"), "must be one of trace, debug, info, notice, warning, error, critical")
                }
                config.logLevel = level
            }
            if let access = try log.optionalBool("access") { config.accessLog.enabled = access }
            if let query = try log.optionalBool("access_query") { config.accessLog.includeQuery = query }
            if let format = try log.optionalString("format") {
                guard let parsed = LogFormat(rawValue: format) else { throw ConfigError(log.fieldPath("format"), "must be text or json") }
                config.logFormat = parsed
            }
            try log.rejectUnknownKeys()
        }
        try readRoutesAndIdentities(root, into: &config)
        return config
    }

    private static func readLimits(_ object: JSONObjectReader) throws -> Config.Limits {
        var limits = Config.Limits()
        if let value = try object.optionalInteger("max_body_bytes", range: 0...(1 << 34)) { limits.maxBodyBytes = value }
        if let value = try object.optionalInteger("max_header_bytes", range: 1024...(1 << 24)) { limits.maxHeaderBytes = value }
        if let value = try object.optionalInteger("max_held_requests", range: 1...1_000_000) { limits.maxHeldRequests = value }
        if let value = try object.optionalInteger("max_client_connections", range: 1...100_000) { limits.maxClientConnections = value }
        if let value = try object.optionalInteger("max_upstream_connections", range: 1...100_000) { limits.maxUpstreamConnections = value }
        if let value = try object.optionalInteger("max_tunnels", range: 1...100_000) { limits.maxTunnels = value }
        if let value = try object.optionalInteger("max_upstream_waiters", range: 0...1_000_000) { limits.maxUpstreamWaiters = value }
        if let value = try object.optionalInteger("listen_backlog", range: 1...65535) { limits.listenBacklog = value }
        if let value = try object.optionalInteger("max_concurrent_streams", range: 1...10_000) { limits.maxConcurrentStreams = value }
        try object.rejectUnknownKeys()
        return limits
    }

    private static func readTimeouts(_ object: JSONObjectReader) throws -> Config.Timeouts {
        var timeouts = Config.Timeouts()
        let range = 0.05...86_400.0
        if let value = try object.optionalNumber("upstream_seconds", range: range) { timeouts.upstreamSeconds = value }
        if let value = try object.optionalNumber("refresh_seconds", range: range) { timeouts.refreshSeconds = value }
        if let value = try object.optionalNumber("hold_seconds", range: range) { timeouts.holdSeconds = value }
        if let value = try object.optionalNumber("drain_seconds", range: 0...3600) { timeouts.drainSeconds = value }
        if let value = try object.optionalNumber("client_seconds", range: range) { timeouts.clientSeconds = value }
        if let value = try object.optionalNumber("client_header_seconds", range: range) { timeouts.clientHeaderSeconds = value }
        if let value = try object.optionalNumber("connect_seconds", range: range) { timeouts.connectSeconds = value }
        if let value = try object.optionalNumber("stream_idle_seconds", range: range) { timeouts.streamIdleSeconds = value }
        if let value = try object.optionalNumber("pool_idle_seconds", range: range) { timeouts.poolIdleSeconds = value }
        if let value = try object.optionalNumber("pool_wait_seconds", range: range) { timeouts.poolWaitSeconds = value }
        if let value = try object.optionalNumber("continue_seconds", range: range) { timeouts.continueSeconds = value }
        try object.rejectUnknownKeys()
        return timeouts
    }
}
