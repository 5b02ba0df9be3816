/// What a reload (SIGHUP) may change: given the running config and a newly loaded, valid one, the config
/// to run from now on and the changes that wait for a restart.
///
/// Everything applies live except what is bound or opened once at start: the listen addresses (the
/// sockets stay bound; rebinding while clients are connected is what a restart is for), the token file
/// (its lock and the tokens in memory belong to it), the token file watch interval (a timer set at
/// start), the HTTP engine of the proxied port (its listener is bound at start) and the log format (the
/// log handler is installed once per process). Those keep their running
/// value, each named in one log line; the rest of the reload still applies.
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

    init(running: Config, loaded: Config) {
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
        keep("tokens.file", running.tokens.file ?? "none", loaded.tokens.file ?? "none") { $0.tokens.file = running.tokens.file }
        keep("tokens.redis", running.tokens.redis.map { "\($0.url) key \($0.key)" } ?? "none",
             loaded.tokens.redis.map { "\($0.url) key \($0.key)" } ?? "none") { $0.tokens.redis = running.tokens.redis }
        keep("tokens.watch_interval_seconds", "\(running.tokens.watchIntervalSeconds)", "\(loaded.tokens.watchIntervalSeconds)") {
            $0.tokens.watchIntervalSeconds = running.tokens.watchIntervalSeconds
        }
        keep("data_plane", running.dataPlane.rawValue, loaded.dataPlane.rawValue) { $0.dataPlane = running.dataPlane }
        keep("log.format", running.logFormat.rawValue, loaded.logFormat.rawValue) { $0.logFormat = running.logFormat }
        self.effective = effective
        needsRestart = deferred
    }
}
