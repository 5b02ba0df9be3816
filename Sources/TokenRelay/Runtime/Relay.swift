import FoundationEssentials
import Glibc
import HTTPTransport
import Logging

/// tokenrelay assembled: the token coordinator, the proxy listener and the admin listener on one event
/// loop, plus signal handling and graceful shutdown.
public final class Relay {
    let loop: EventLoop
    /// The running configuration (a reload replaces it).
    var config: Config
    let logger: Logger
    let redactor: SecretRedactor
    /// Where a reload reads the config from, and the log level it may change (nil: no reload, as in the demo).
    let reloadSource: ReloadSource?
    var refreshTLS: TLSContext?
    var clientSecret: String?
    /// The keys of private_key_jwt and jwt_bearer, as the last start or reload loaded them.
    var credentialKeys: CredentialKeys
    /// The keys the token stores seal with (`tokens.encryption`), shared with them so a reload reaches them.
    let tokenSealer: TokenSealer?
    var secretWatch: ClientSecretWatch?
    var credentialFilesWatch: CredentialFilesWatch?
    var adminTokenWatch: FileChangeWatch?
    /// The process's metrics; with `identities`, the top-level identity's carry `identity="default"`.
    let metrics: RelayMetrics
    /// The top-level identity's; nil in a config without one (`Config.hasDefaultIdentity`), where every route
    /// names an identity of `namedIdentities`.
    let coordinator: RefreshCoordinator?
    /// `identities`, each with its own token store and refresh coordinator (the top-level one is `coordinator`).
    var namedIdentities: [NamedIdentity]
    /// Identities a reload removed, stopped but kept (`applyIdentities`).
    var retiredIdentities: [NamedIdentity] = []
    /// Every identity's coordinator, the top-level one first.
    var coordinators: [RefreshCoordinator] { Array(coordinator.map { [$0] } ?? []) + (namedIdentities + retiredIdentities).map(\.coordinator) }
    /// The top-level identity's token endpoint client (nil without one).
    let endpoint: TokenEndpointClient?
    let proxy: ProxyServer
    private(set) var admin: AdminServer?
    /// DPoP proofs (`dpop`; the top-level identity's), nil without.
    let dpop: DPoPProofs?
    private var signalWatches: [TransportSignal] = []
    private var drainTimer: LoopEvent?
    private(set) var stopping = false
    /// SIGHUP reloads: which one is being prepared off the loop, and whether its result may be applied.
    var reloads = ReloadSchedule()
    let systemd = SystemdNotifier()

    /// Bound proxy port (useful when the config asked for port 0).
    public var proxyPort: Int { proxy.boundPort }
    public var adminPort: Int? { admin?.listener.boundPort }


    init(loop: EventLoop, preflight started: Preflight, redactor: SecretRedactor, logger: Logger, reloadSource: ReloadSource? = nil) throws {
        var preflight = started
        self.loop = loop
        metrics = RelayMetrics(identity: preflight.config.identities.isEmpty ? nil : Config.defaultIdentityName)
        // Without a top-level identity no `identity="default"` series is shown: there is no such identity.
        if !preflight.config.hasDefaultIdentity { metrics.retire() }
        config = preflight.config
        self.logger = logger
        self.redactor = redactor
        self.reloadSource = reloadSource
        refreshTLS = preflight.refreshTLS
        clientSecret = preflight.clientSecret
        credentialKeys = preflight.credentialKeys
        tokenSealer = preflight.codecs.sealer
        redactor.update([preflight.tokens.accessToken, preflight.tokens.refreshToken])
        redactor.add(preflight.clientSecret)
        if let warning = FileDescriptorBudget.ensure(for: config.limits) { logger.warning("\(warning)") }
        if let warning = config.dataPlane.retiredWarning { logger.warning("\(warning)") }
        if let warning = config.heldRequestShareWarning { logger.warning("\(warning)") }
        if let warning = TokenExpiry.clampWarning(for: preflight.tokens, now: Date()) { logger.warning("token file: \(warning)") }
        for field in preflight.unverifiedTLSTargets {
            logger.warning("TLS certificate verification is disabled; the connection can be intercepted", metadata: ["target": "\(field)"])
        }
        let fleetKey = preflight.redis.flatMap { endpoint in
            preflight.config.tokens.redis.map { DPoPFleetKey(endpoint: endpoint, settings: $0, codec: preflight.codecs.redis) }
        }
        let dpopKey = try Self.dpopKeySource(config: preflight.config, tokens: &preflight.tokens, fleet: fleetKey, logger: logger)
        dpop = try Self.dpopProofs(config: preflight.config, source: dpopKey, tokens: preflight.tokens, metrics: metrics, logger: logger)
        for identity in preflight.identities { try identity.loadDPoPKey(logger: logger) }
        redactor.add(preflight.redis?.password)
        if preflight.config.hasDefaultIdentity {
            let endpoint = Self.makeTokenEndpoint(loop: loop, preflight: preflight)
            endpoint.dpop = dpop
            self.endpoint = endpoint
            coordinator = try Self.makeCoordinator(loop: loop, preflight: preflight, endpoint: endpoint, metrics: metrics, redactor: redactor, logger: logger)
            coordinator?.dpop = dpop
            if let coordinator { try Self.keepDPoPKeyInRecord(coordinator, dpop: dpop, preflight: preflight, logger: logger) }
        } else {
            endpoint = nil
            coordinator = nil
        }
        let metrics = self.metrics
        namedIdentities = try preflight.identities.map { try NamedIdentity($0, loop: loop, metrics: metrics, redactor: redactor, logger: logger) }
        proxy = try ProxyServer(loop: loop, config: config, upstreamTLS: preflight.upstreamTLS, routeTLS: preflight.routeUpstreamTLS, coordinator: coordinator,
                                identities: namedIdentities, metrics: metrics, logger: logger)
        if let adminConfig = config.admin {
            // Read before the loop serves, like the client secret; never logged.
            let bearer = try adminConfig.tokenFile.map { try AdminBearerToken.load(path: $0) }
            redactor.add(bearer?.text)
            admin = try AdminServer(loop: loop, address: adminConfig.listen, coordinator: coordinator, identities: namedIdentities,
                                    proxy: proxy, metrics: metrics, bearerToken: bearer)
        }
        coordinator?.start(watchInterval: config.tokens.watchIntervalSeconds)
        namedIdentities.forEach { $0.start() }
        watchClientSecret()
        watchCredentialFiles()
        watchAdminToken()
    }

    /// Redis when configured (fleet mode), else the token file with its lock.
    static func tokenStore(loop: EventLoop, preflight: Preflight) throws -> any TokenStore {
        if let endpoint = preflight.redis, let settings = preflight.config.tokens.redis {
            let sentinel = try RedisSentinelTarget.build(settings: settings, dataNode: endpoint).map {
                RedisSentinelLocator(loop: loop, target: $0, commandTimeout: settings.commandTimeoutSeconds)
            }
            let store = RedisTokenStore(loop: loop, settings: settings, endpoint: endpoint, refreshSeconds: preflight.config.timeouts.refreshSeconds,
                                        sentinel: sentinel)
            store.codec = preflight.codecs.redis
            return store
        }
        guard let tokenFile = preflight.tokenFile else { throw ConfigError("tokens.file", "is required") }
        return FileTokenStore(file: tokenFile, lock: try TokenFileLock(tokenFilePath: tokenFile.path, loop: loop), loop: loop)
    }

    static func tokenEndpointConnection(config: Config, tls: TLSContext?) -> TokenEndpointConnection {
        TokenEndpointConnection(endpoint: config.refresh.tokenURL, tls: tls?.transport, timeoutSeconds: config.timeouts.refreshSeconds)
    }

    /// Runs `tokenrelay run`: blocks until SIGTERM/SIGINT and the drain that follows. SIGHUP reloads
    /// from `reloadSource`.
    public static func run(preflight: Preflight, redactor: SecretRedactor, logger: Logger, reloadSource: ReloadSource? = nil) throws {
        let recovered = try StartupLeftoverRecovery.recover(preflight, logger: logger)
        let preflight = try StartupResealing.reseal(recovered, logger: logger)
        let loop = try EventLoop()
        let relay = try Relay(loop: loop, preflight: preflight, redactor: redactor, logger: logger, reloadSource: reloadSource)
        relay.installSignalHandlers()
        relay.announce()
        relay.systemd.ready(loop: loop, status: "proxying to \(relay.config.proxyingSummary)")
        // Everything from here on is the steady state: the code only starting needed goes back (last, so
        // that no start-up code runs after it and is mapped back).
        let released = StartupPages.release()
        logger.debug("start-up code pages released", metadata: ["mapped_bytes": "\(released)"])
        loop.run()
        relay.close()
        try relay.finishAtExit()
    }

    func announce() {
        let adminText = admin.map { "\(config.admin!.listen.host):\($0.listener.boundPort)" } ?? "disabled"
        logger.info("listening", metadata: [
            "proxy": "\(config.listen.host):\(proxyPort)",
            "admin": "\(adminText)",
            "upstream": "\(config.proxyingSummary)",
            "generation": "\(coordinator.map { "\($0.generation)" } ?? "none (no top-level identity)")",
        ])
        for route in config.routes where route.listen != nil {
            logger.info("route listening", metadata: ["route": "\(route.name)", "proxy": "\(route.listen!.host):\(proxy.frontEnd.port(ofRoute: route.name) ?? 0)"])
        }
    }

    func installSignalHandlers() {
        for signalNumber in [SIGTERM, SIGINT] {
            watch(signalNumber) { [unowned self] in self.shutdown(signal: signalNumber) }
        }
        // Without a handler SIGHUP kills the process (a closed terminal, a log-rotation hook, `systemctl reload`).
        watch(SIGHUP) { [unowned self] in self.reload() }
        // Log-rotation hooks send SIGUSR1 to make a daemon reopen its log file; tokenrelay writes to stderr
        // only, so there is nothing to reopen, and the default action would end the process.
        watch(SIGUSR1) { [unowned self] in self.logger.info("SIGUSR1: logs go to stderr only; nothing to reopen") }
    }

    private func watch(_ signalNumber: Int32, _ handler: @escaping () -> Void) {
        do {
            signalWatches.append(try TransportSignal(loop: loop.transport, signal: signalNumber, handler: handler))
        } catch {
            // Only reachable when the process is out of descriptors at start: the signal keeps its default action.
            logger.warning("\(error.description); the signal keeps its default action")
        }
    }

    /// Stops accepting, lets in-flight and held requests finish up to the drain timeout, then stops the
    /// loop. A second signal cuts the drain short.
    func shutdown(signal: Int32) {
        if stopping {
            logger.warning("second signal; stopping now")
            proxy.abandonRemaining()
            loop.stop()
            return
        }
        stopping = true
        reloads.shutdownBegan()
        systemd.stopping()
        logger.info("shutting down", metadata: ["signal": "\(signal)", "active_requests": "\(proxy.activeCount)",
                                                "drain_seconds": "\(config.timeouts.drainSeconds)"])
        proxy.onDrained = { [unowned self] in
            self.logger.info("drained; exiting")
            self.loop.stop()
        }
        let timer = LoopEvent(loop: loop) { [unowned self] _ in
            self.logger.warning("drain timeout; answering remaining requests", metadata: ["active_requests": "\(self.proxy.activeCount)"])
            // The answers need a moment to be written out; `onDrained` stops the loop once they are,
            // and a client that never reads cannot hold the exit up for more than a second.
            // A refresh still talking to the token endpoint gets up to refresh_seconds: exiting before its
            // answer is saved would lose a rotated refresh token.
            self.drainTimer = LoopEvent(loop: self.loop) { [unowned self] _ in self.loop.stop() }
            let grace = self.coordinators.contains(where: \.isTalkingToTokenEndpoint) ? max(1, self.config.timeouts.refreshSeconds) : 1
            self.drainTimer?.schedule(after: grace)
            self.proxy.abandonRemaining()
        }
        timer.schedule(after: config.timeouts.drainSeconds)
        drainTimer = timer
        proxy.startDraining()
    }

    func close() {
        signalWatches = []
        drainTimer = nil
        systemd.close()
        secretWatch = nil
        credentialFilesWatch = nil
        adminTokenWatch = nil
        proxy.closePools()
    }

    /// Every identity's unfinished business at exit (tokens not saved, a refresh in flight), all of it reported.
    func finishAtExit() throws {
        var problems: [String] = []
        for (name, coordinator) in Array(coordinator.map { [("", $0)] } ?? []) + (namedIdentities + retiredIdentities).map({ ($0.name, $0.coordinator) }) {
            do {
                try coordinator.finishAtExit()
            } catch {
                problems.append(name.isEmpty ? "\(error)" : "identity \(name): \(error)")
            }
        }
        guard problems.isEmpty else { throw UnfinishedBusinessAtExit(description: problems.joined(separator: "; ")) }
    }
}
