import Logging

/// What a reload needs that the running relay does not otherwise keep: the config file's path, and the
/// process-wide log level.
public struct ReloadSource: Sendable {
    public let configPath: String
    public let logLevel: LogLevelControl

    public init(configPath: String, logLevel: LogLevelControl) {
        self.configPath = configPath
        self.logLevel = logLevel
    }
}

extension Relay {
    /// SIGHUP: read the config file and the client secret again, validate them exactly as `check` does,
    /// and apply what can change live. Connections, requests in flight and held requests are untouched
    /// (they keep the upstream route they started with; a refresh in flight finishes with its settings).
    /// An invalid config changes nothing: one line names the field, the running config stays.
    func reload() {
        guard let source = reloadSource else { return logger.warning("SIGHUP ignored: no config file to reload from") }
        guard !stopping else { return logger.info("SIGHUP ignored while shutting down") }
        systemd.reloading()
        defer { systemd.reloaded(status: "proxying to \(config.upstream.url)") }
        let preflight: Preflight
        do {
            preflight = try Preflight.run(configPath: source.configPath)
        } catch {
            metrics.countConfigReload(outcome: "invalid")
            return logger.error("config reload failed; the running config stays", metadata: ["error": "\(error)"])
        }
        let plan = ConfigReload(running: config, loaded: preflight.config)
        for deferred in plan.needsRestart {
            logger.warning("config reload: \(deferred)")
        }
        apply(plan.effective, preflight: preflight)
        metrics.countConfigReload(outcome: plan.needsRestart.isEmpty ? "applied" : "needs_restart")
        logger.info("config reloaded", metadata: [
            "upstream": "\(config.upstream.url)",
            "needs_restart": "\(plan.needsRestart.isEmpty ? "none" : plan.needsRestart.map(\.field).joined(separator: ","))",
        ])
        // Last, so the outcome of this reload is still logged at the level in force when it was asked for.
        source.logLevel.current = Logger.Level(rawValue: config.logLevel) ?? .info
    }

    private func apply(_ next: Config, preflight: Preflight) {
        if let warning = FileDescriptorBudget.ensure(for: next.limits) { logger.warning("\(warning)") }
        for field in preflight.unverifiedTLSTargets {
            logger.warning("TLS certificate verification is disabled; the connection can be intercepted", metadata: ["target": "\(field)"])
        }
        if let secret = preflight.clientSecret { redactor.add(secret) }
        self.config = next
        refreshTLS = preflight.refreshTLS
        clientSecret = preflight.clientSecret
        proxy.apply(next, upstreamTLS: preflight.upstreamTLS)
        reconfigureTokenEndpoint()
        coordinator.apply(settings: next.refresh, injection: next.inject, refreshTimeout: next.timeouts.refreshSeconds,
                          lockTimeout: RefreshCoordinator.lockTimeout(for: next))
        watchClientSecret()
    }

    /// The token endpoint client with the running refresh settings and client secret, from its next exchange on.
    func reconfigureTokenEndpoint() {
        endpoint.reconfigure(factory: Self.tokenEndpointConnections(loop: loop, config: config, tls: refreshTLS),
                             grant: TokenGrants.make(config.refresh, clientSecret: clientSecret))
    }

    /// (Re)starts the watch on `refresh.client_secret_file`, for the file the running config names.
    func watchClientSecret() {
        secretWatch = ClientSecretWatch(source: config.refresh.clientSecret, loop: loop, interval: config.tokens.watchIntervalSeconds,
                                        logger: logger) { [unowned self] secret in
            self.redactor.add(secret)
            self.clientSecret = secret
            self.reconfigureTokenEndpoint()
        }
    }
}
