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

/// A preparation's result, carried from the helper thread to the loop. Unchecked because `Preflight` holds
/// OpenSSL contexts (`TLSContext`): an `SSL_CTX` may be built on one thread and used on another once
/// handed over, and the helper thread keeps no reference after returning it. Nothing in a `Preflight` is a
/// libevent object (those are made on the loop, when the result is applied).
struct PreparedReload: @unchecked Sendable {
    let outcome: Result<Preflight, any Error>
}

extension Relay {
    /// SIGHUP: read the config file and the client secret again, validate them exactly as `check` does,
    /// and apply what can change live. Connections, requests in flight and held requests are untouched
    /// (they keep the upstream route they started with; a refresh in flight finishes with its settings).
    /// An invalid config changes nothing: one line names the field, the running config stays.
    ///
    /// The reading and checking run off the loop (they block on files), so the loop keeps serving
    /// meanwhile; `ReloadSchedule` decides when a result may be applied.
    func reload() {
        guard reloadSource != nil else { return logger.warning("SIGHUP ignored: no config file to reload from") }
        perform(reloads.signalled())
    }

    private func perform(_ actions: [ReloadSchedule.Action], prepared: PreparedReload? = nil) {
        for action in actions {
            switch action {
            case .notifyReloading: systemd.reloading()
            case .prepare: prepareReload()
            case .applyPrepared: if let prepared { applyReload(prepared) }
            case .discardSuperseded:
                logger.info("config reload superseded by a later SIGHUP; reading the config again")
            case .discardShuttingDown:
                logger.info("config reload abandoned: shutting down with the running config")
            case .notifyReady: systemd.reloaded(status: "proxying to \(config.proxyingSummary)")
            case .noteRequestedAgain:
                logger.info("SIGHUP while a reload is being prepared; the config is read again once it is done")
            case .ignoreShuttingDown: logger.info("SIGHUP ignored while shutting down")
            }
        }
    }

    /// Reads and checks the config on a helper thread: the same `Preflight` as `check`, which touches
    /// files and builds OpenSSL contexts, never the loop's state.
    private func prepareReload() {
        guard let path = reloadSource?.configPath else { return }
        let logger = self.logger
        OffLoopWork.run(on: loop, {
            PreparedReload(outcome: Result {
                let preflight = try Preflight.run(configPath: path)
                // An identity's DPoP key is loaded here, off the loop (a file read, a generation, a Redis one-shot).
                for identity in preflight.identities { try identity.loadDPoPKey(logger: logger) }
                return preflight
            })
        }) { [weak self] prepared in
            guard let self else { return }
            self.perform(self.reloads.prepared(), prepared: prepared)
        }
    }

    private func applyReload(_ prepared: PreparedReload) {
        let preflight: Preflight
        switch prepared.outcome {
        case .success(let checked): preflight = checked
        case .failure(let error):
            metrics.countConfigReload(outcome: "invalid")
            return logger.error("config reload failed; the running config stays", metadata: ["error": "\(error)"])
        }
        let plan = ConfigReload(running: config, loaded: preflight.config)
        for deferred in plan.needsRestart {
            logger.warning("config reload: \(deferred)")
        }
        do {
            try plan.validate()
        } catch {
            metrics.countConfigReload(outcome: "invalid")
            return logger.error("config reload failed; the running config stays", metadata: ["error": "\(error) (with the running values kept)"])
        }
        // The identities the plan applies (the first ones of a process started without any wait for a restart).
        let applied = Set(plan.effective.identities.map(\.name))
        let identities = preflight.identities.filter { applied.contains($0.name) }
        let added: [NamedIdentity]
        do {
            // Made before anything is applied: an identity whose token store cannot be opened fails the whole
            // reload, instead of leaving a route without its identity.
            added = try makeAddedIdentities(identities)
        } catch {
            metrics.countConfigReload(outcome: "invalid")
            return logger.error("config reload failed; the running config stays", metadata: ["error": "\(error)"])
        }
        applyIdentities(identities, added: added)
        apply(plan.effective, preflight: preflight)
        metrics.countConfigReload(outcome: plan.needsRestart.isEmpty ? "applied" : "needs_restart")
        logger.info("config reloaded", metadata: [
            "upstream": "\(config.proxyingSummary)",
            "needs_restart": "\(plan.needsRestart.isEmpty ? "none" : plan.needsRestart.map(\.field).joined(separator: ","))",
        ])
        // Last, so the outcome of this reload is still logged at the level in force when it was asked for.
        reloadSource?.logLevel.current = Logger.Level(rawValue: config.logLevel) ?? .info
    }

    private func apply(_ next: Config, preflight: Preflight) {
        if let warning = FileDescriptorBudget.ensure(for: next.limits) { logger.warning("\(warning)") }
        if let warning = next.heldRequestShareWarning { logger.warning("\(warning)") }
        for field in preflight.unverifiedTLSTargets {
            logger.warning("TLS certificate verification is disabled; the connection can be intercepted", metadata: ["target": "\(field)"])
        }
        if let secret = preflight.clientSecret { redactor.add(secret) }
        let credentialChange = Self.credentialChange(from: (config.refresh, credentialKeys), to: (next.refresh, preflight.credentialKeys))
            ?? (preflight.clientSecret != clientSecret ? "a new client secret" : nil)
        self.config = next
        refreshTLS = preflight.refreshTLS
        clientSecret = preflight.clientSecret
        credentialKeys = preflight.credentialKeys
        // The stores keep their sealer; a reload brings the key files' current content (a rotation).
        if let running = tokenSealer, let loaded = preflight.codecs.sealer { running.use(loaded.keyring) }
        proxy.apply(next, upstreamTLS: preflight.upstreamTLS, routeTLS: preflight.routeUpstreamTLS)
        reconfigureTokenEndpoint()
        coordinator?.apply(settings: next.refresh, injection: next.inject, refreshTimeout: next.timeouts.refreshSeconds,
                          lockTimeout: RefreshCoordinator.lockTimeout(for: next),
                          lockLifetime: next.tokens.redis?.effectiveLockSeconds(refreshSeconds: next.timeouts.refreshSeconds))
        watchClientSecret()
        watchCredentialFiles()
        if let credentialChange { clientCredentialChanged("reload: \(credentialChange)") }
    }

    /// The token endpoint client with the running refresh settings and client secret, from its next exchange on.
    func reconfigureTokenEndpoint() {
        endpoint?.reconfigure(connection: Self.tokenEndpointConnection(config: config, tls: refreshTLS),
                             grant: TokenGrants.make(config.refresh, clientSecret: clientSecret, keys: credentialKeys))
    }

    /// (Re)starts the watch on `refresh.client_secret_file`, for the file the running config names.
    func watchClientSecret() {
        guard config.hasDefaultIdentity else { return }
        secretWatch = ClientSecretWatch(source: config.refresh.clientSecret, loop: loop, interval: config.tokens.watchIntervalSeconds,
                                        logger: logger) { [unowned self] secret in
            self.redactor.add(secret)
            self.clientSecret = secret
            self.reconfigureTokenEndpoint()
            self.clientCredentialChanged("client secret file replaced")
        }
    }
}
