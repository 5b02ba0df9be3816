/// What a reload (SIGHUP) may change: given the running config and a newly loaded, valid one, the config
/// to run from now on and the changes that wait for a restart.
///
/// Everything applies live except what is bound or opened once at start: the listen addresses (the
/// sockets stay bound; rebinding while clients are connected is what a restart is for), the token file
/// (its lock and the tokens in memory belong to it), the token file watch interval (a timer set at
/// start), the HTTP engine of the proxied port (its listener is bound at start), the log format (the log
/// handler is installed once per process) and the Redis store's connection settings (all of
/// `tokens.redis` but `lock_seconds`). Those keep their running value, each named in one log line; the
/// rest of the reload still applies.
struct ConfigReload {
    /// A change that needs a restart: the field, what runs, and what the file asks for.
    struct Deferred: Equatable, CustomStringConvertible {
        let field: String
        let running: String
        let requested: String

        var description: String { "\(field): changing it needs a restart (running \(running), config file says \(requested))" }
    }

    /// The config to apply: the loaded one with every restart-only field as it runs.
    let effective: Config
    let needsRestart: [Deferred]
    /// Why the loaded config cannot be applied at all, with the running one kept whole.
    private var refusal: ConfigError?

    private static func describe(_ dpop: DPoPSettings?) -> String {
        guard let dpop else { return "none" }
        return "alg \(dpop.alg.rawValue), key_file \(dpop.keyFile ?? "none (kept with the token state)")"
    }

    init(running: Config, loaded: Config) {
        // The top-level identity's token store is opened (and locked) at start, like any token file: a reload
        // that adds or removes it is refused whole, instead of leaving routes without the identity they expect.
        if running.hasDefaultIdentity != loaded.hasDefaultIdentity {
            effective = running
            needsRestart = []
            movedTokenState = nil
            refusal = ConfigError("tokens", "the reload \(loaded.hasDefaultIdentity ? "adds a" : "removes the") top-level identity (tokens, refresh); "
                + "that needs a restart")
            return
        }
        var effective = loaded
        var deferred: [Deferred] = []
        func keep(_ field: String, _ running: String, _ requested: String, restore: (inout Config) -> Void) {
            guard running != requested else { return }
            deferred.append(Deferred(field: field, running: running, requested: requested))
            restore(&effective)
        }
        keep("listen", running.listen.description, loaded.listen.description) { $0.listen = running.listen }
        keep("admin.listen", running.admin?.listen.description ?? "none", loaded.admin?.listen.description ?? "none") {
            $0.admin = running.admin
        }
        keep("admin.token_file", running.admin?.tokenFile ?? "none", loaded.admin?.tokenFile ?? "none") {
            $0.admin?.tokenFile = running.admin?.tokenFile
        }
        keep("tokens.file", running.tokens.file ?? "none", loaded.tokens.file ?? "none") { $0.tokens.file = running.tokens.file }
        keep("tokens.redis", running.tokens.redis?.restartOnlyDescription ?? "none", loaded.tokens.redis?.restartOnlyDescription ?? "none") {
            // lock_seconds still applies when both configs use Redis: the next lock taken lives that long.
            let lockSeconds = $0.tokens.redis?.lockSeconds
            $0.tokens.redis = running.tokens.redis
            if running.tokens.redis != nil && loaded.tokens.redis != nil { $0.tokens.redis?.lockSeconds = lockSeconds }
        }
        // Switching sealing on or off changes what the stores write: a restart (which also reseals the file).
        keep("tokens.encryption", running.tokens.encryption == nil ? "none" : "configured", loaded.tokens.encryption == nil ? "none" : "configured") {
            $0.tokens.encryption = running.tokens.encryption
        }
        keep("tokens.watch_interval_seconds", "\(running.tokens.watchIntervalSeconds)", "\(loaded.tokens.watchIntervalSeconds)") {
            $0.tokens.watchIntervalSeconds = running.tokens.watchIntervalSeconds
        }
        // Route listeners are bound at start (a host name goes through the blocking resolver): a route with
        // its own listen keeps running as it is if the file adds, moves or removes it; routes on the main
        // listener, and listen routes whose address stays, change live.
        keep("routes[].listen", Self.describeListeners(running), Self.describeListeners(loaded)) { config in
            let bound = Set(running.routes.compactMap { route in route.listen.map { "\(route.name)=\($0)" } })
            config.routes.removeAll { route in route.listen.map { !bound.contains("\(route.name)=\($0)") } ?? false }
            let served = Set(config.routes.map(\.name))
            config.routes += running.routes.filter { $0.listen != nil && !served.contains($0.name) }
        }
        // The first identities of a process started without any wait for a restart, with the routes that
        // come with them: the top level's refresh and token metrics carry an `identity` label only when the
        // process starts with identities, and one registry cannot hold a metric both with and without labels
        // (the added identity's labelled series would abort the process).
        if running.identities.isEmpty && !loaded.identities.isEmpty {
            keep("identities", "none", loaded.identities.map(\.name).joined(separator: ",")) { config in
                config.identities = []
                config.routes = running.routes
            }
        }
        // Identities are added and removed live (`Relay.applyIdentities`); one that stays keeps its token
        // store and refresh machine, so its token settings wait for a restart like the top level's.
        for (index, identity) in loaded.identities.enumerated() {
            guard let runningIdentity = running.identities.first(where: { $0.name == identity.name }) else { continue }
            keep("identities.\(identity.name).tokens", Self.describe(runningIdentity.tokens), Self.describe(identity.tokens)) {
                $0.identities[index].tokens = runningIdentity.tokens
            }
            keep("identities.\(identity.name).dpop", Self.describe(runningIdentity.dpop), Self.describe(identity.dpop)) {
                $0.identities[index].dpop = runningIdentity.dpop
            }
        }
        // The DPoP key and alg are loaded at start (a key file read, or the state's key) and the tokens are bound to it.
        keep("dpop", Self.describe(running.dpop), Self.describe(loaded.dpop)) { $0.dpop = running.dpop }
        keep("data_plane", running.dataPlane.rawValue, loaded.dataPlane.rawValue) { $0.dataPlane = running.dataPlane }
        keep("log.format", running.logFormat.rawValue, loaded.logFormat.rawValue) { $0.logFormat = running.logFormat }
        self.effective = effective
        needsRestart = deferred
        movedTokenState = Self.movedTokenState(running: running, loaded: loaded)
    }

    /// A token store the loaded config gives to another identity than the one running on it, which stays
    /// (identities swapped their files). A staying identity keeps its running store until a restart, so
    /// applying the rest would pair that store with the other identity's refresh settings and routes: a
    /// refresh token sent to the other's token endpoint, an access token to the other's upstream.
    private let movedTokenState: ConfigError?

    private static func movedTokenState(running: Config, loaded: Config) -> ConfigError? {
        let owners: (Config) -> [(name: String?, field: String, tokens: Config.Tokens)] = { config in
            [(nil, "tokens", config.tokens)] + config.identities.map { ($0.name, "identities.\($0.name).tokens", $0.tokens) }
        }
        let loadedOwners = owners(loaded)
        let staying = owners(running).filter { owner in loadedOwners.contains { $0.name == owner.name } }
        for owner in loadedOwners {
            if let other = staying.first(where: { $0.name != owner.name && RouteChecks.sameTokenState($0.tokens, owner.tokens) }) {
                return ConfigError(owner.field, "names the token store \(other.field) runs on, which stays with it until a restart; moving a token store to another identity needs a restart")
            }
        }
        return nil
    }

    /// The loaded config was valid on its own; with restart-only values kept it may not be. The one case:
    /// the refresh lock checked against a `command_timeout_seconds` that does not apply live (a lock too
    /// short for the running command timeout would make every refresh stop short of the token endpoint).
    /// And a route whose own listener stays (until a restart) naming an identity the reload removes, and a
    /// token store moved from one staying identity to another (`movedTokenState`).
    func validate() throws {
        if let refusal { throw refusal }
        if let movedTokenState { throw movedTokenState }
        // A route kept for its listener must still find its identity.
        for (index, route) in effective.routes.enumerated() {
            if let identity = route.identity, !effective.identities.contains(where: { $0.name == identity }) {
                throw ConfigError("routes[\(index)].identity", "names \(identity), which the reload removes, while the route's listener stays until a restart")
            }
        }
        try effective.tokens.redis?.validateLock(refreshSeconds: effective.timeouts.refreshSeconds)
    }

    /// The routes with their own listener, as `name=host:port`, sorted.
    private static func describeListeners(_ config: Config) -> String {
        let listeners = config.routes.compactMap { route in route.listen.map { "\(route.name)=\($0)" } }.sorted()
        return listeners.isEmpty ? "none" : listeners.joined(separator: " ")
    }

    /// An identity's token store as one line for the restart notice (paths and the Redis key, never a secret).
    private static func describe(_ tokens: Config.Tokens) -> String {
        let store = tokens.redis.map { "redis \($0.restartOnlyDescription)" } ?? "file \(tokens.file ?? "none")"
        let cache = tokens.redis != nil ? " cache \(tokens.file ?? "none")" : ""
        return store + cache + " watch_interval_seconds \(tokens.watchIntervalSeconds) encryption \(tokens.encryption == nil ? "off" : "on")"
    }
}
