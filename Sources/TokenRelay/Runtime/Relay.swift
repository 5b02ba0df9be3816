import CLibevent
import Glibc
import Logging

/// tokenrelay assembled: the token coordinator, the proxy listener and the admin listener on one event
/// loop, plus signal handling and graceful shutdown.
public final class Relay {
    private let loop: EventLoop
    private let config: Config
    private let logger: Logger
    private let metrics = RelayMetrics()
    private let coordinator: RefreshCoordinator
    private let endpoint: TokenEndpointClient
    private let proxy: ProxyServer
    private var admin: AdminServer?
    private var signalEvents: [LoopEvent] = []
    private var drainTimer: LoopEvent?
    private var stopping = false
    private let systemd = SystemdNotifier()

    /// Bound proxy port (useful when the config asked for port 0).
    public var proxyPort: Int { proxy.listener.boundPort }
    public var adminPort: Int? { admin?.listener.boundPort }


    init(loop: EventLoop, preflight: Preflight, redactor: SecretRedactor, logger: Logger) throws {
        self.loop = loop
        config = preflight.config
        self.logger = logger
        redactor.update([preflight.tokens.accessToken, preflight.tokens.refreshToken])
        redactor.add(preflight.clientSecret)
        if let warning = FileDescriptorBudget.ensure(for: config.limits) { logger.warning("\(warning)") }
        for field in preflight.unverifiedTLSTargets {
            logger.warning("TLS certificate verification is disabled; the connection can be intercepted", metadata: ["target": "\(field)"])
        }
        let tokenEndpointConnections = HTTPConnectionFactory(loop: loop, endpoint: config.refresh.tokenURL, tls: preflight.refreshTLS,
                                                             timeoutSeconds: config.timeouts.refreshSeconds)
        endpoint = TokenEndpointClient(factory: tokenEndpointConnections,
                                       grant: TokenGrants.make(config.refresh, clientSecret: preflight.clientSecret))
        let lock = try TokenFileLock(tokenFilePath: preflight.tokenFile.path, loop: loop)
        coordinator = RefreshCoordinator(loop: loop, endpoint: endpoint, store: FileTokenStore(file: preflight.tokenFile, lock: lock),
                                         initialTokens: preflight.tokens,
                                         settings: config.refresh, injection: config.inject, lockTimeout: config.timeouts.refreshSeconds * 3,
                                         refreshTimeout: config.timeouts.refreshSeconds,
                                         metrics: metrics, redactor: redactor, logger: logger)
        proxy = try ProxyServer(loop: loop, config: config, upstreamTLS: preflight.upstreamTLS, coordinator: coordinator,
                                metrics: metrics, logger: logger)
        if let adminConfig = config.admin {
            admin = try AdminServer(loop: loop, address: adminConfig.listen, coordinator: coordinator, proxy: proxy, metrics: metrics)
        }
        coordinator.start(watchInterval: config.tokens.watchIntervalSeconds)
    }

    /// Runs `tokenrelay run`: blocks until SIGTERM/SIGINT and the drain that follows.
    public static func run(preflight: Preflight, redactor: SecretRedactor, logger: Logger) throws {
        let loop = try EventLoop()
        let relay = try Relay(loop: loop, preflight: preflight, redactor: redactor, logger: logger)
        relay.installSignalHandlers()
        relay.announce()
        relay.systemd.ready(loop: loop, status: "proxying to \(relay.config.upstream.url)")
        loop.run()
        relay.close()
        try relay.coordinator.saveUnsavedTokensAtExit()
    }

    func announce() {
        let adminText = admin.map { "\(config.admin!.listen.host):\($0.listener.boundPort)" } ?? "disabled"
        logger.info("listening", metadata: [
            "proxy": "\(config.listen.host):\(proxyPort)",
            "admin": "\(adminText)",
            "upstream": "\(config.upstream.url)",
            "generation": "\(coordinator.generation)",
        ])
    }

    func installSignalHandlers() {
        for signalNumber in [SIGTERM, SIGINT] {
            let event = LoopEvent(loop: loop, fd: signalNumber, events: Int32(EV_SIGNAL | EV_PERSIST)) { [unowned self] _ in
                self.shutdown(signal: signalNumber)
            }
            event.schedule()
            signalEvents.append(event)
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
            let grace = self.coordinator.isTalkingToTokenEndpoint ? max(1, self.config.timeouts.refreshSeconds) : 1
            self.drainTimer?.schedule(after: grace)
            self.proxy.abandonRemaining()
        }
        timer.schedule(after: config.timeouts.drainSeconds)
        drainTimer = timer
        proxy.startDraining()
    }

    func close() {
        signalEvents = []
        drainTimer = nil
        systemd.close()
        proxy.pool.close()
    }
}
