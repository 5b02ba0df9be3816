import FoundationEssentials
import Logging

/// One entry of `identities` running: its token endpoint client, token store and refresh coordinator,
/// made exactly as the top-level identity's are (`Relay.makeCoordinator`) from its own preflight. Nothing
/// is shared with another identity but the loop, the metrics and the list of secrets to redact, so a
/// storm, a latch or an outage of one changes nothing for the others.
final class NamedIdentity {
    let name: String
    /// The running config seen as this identity (`Config.scoped(to:)`).
    private(set) var config: Config
    private let redactor: SecretRedactor
    let endpoint: TokenEndpointClient
    let coordinator: RefreshCoordinator
    /// This identity's metrics (its `identity`-labelled series over the relay's registry).
    private let metrics: RelayMetrics
    private let loop: EventLoop
    private let logger: Logger
    /// The keys this identity signs with, as its last start or reload loaded them.
    private var credentialKeys: CredentialKeys
    /// This identity's assertion / subject-token files, for its running settings.
    private var credentialFilesWatch: CredentialFilesWatch?
    /// This identity's `refresh.client_secret_file`, watched as the top level's is: a rotated secret is used
    /// from the next exchange on, and a client authentication refused for the old one is asked again at once.
    private var secretWatch: ClientSecretWatch?
    private var clientSecret: String?
    private var refreshTLS: TLSContext?

    init(_ named: NamedPreflight, loop: EventLoop, metrics: RelayMetrics, redactor: SecretRedactor, logger: Logger) throws {
        name = named.name
        let preflight = named.preflight
        config = preflight.config
        var logger = logger
        logger[metadataKey: "identity"] = "\(named.name)"
        let redactor = redactor.forIdentity(named.name)
        self.redactor = redactor
        redactor.update([preflight.tokens.accessToken, preflight.tokens.refreshToken])
        redactor.add(preflight.clientSecret)
        redactor.add(preflight.redis?.password)
        if let warning = TokenExpiry.clampWarning(for: preflight.tokens, now: Date()) { logger.warning("token file: \(warning)") }
        let identityMetrics = RelayMetrics(identity: named.name, sharing: metrics)
        self.metrics = identityMetrics
        let dpop: DPoPProofs?
        do {
            dpop = try Relay.dpopProofs(config: preflight.config, source: named.dpopKey, tokens: preflight.tokens, metrics: identityMetrics, logger: logger)
        } catch let error as ConfigError {
            throw error.underIdentity(named.name)
        }
        endpoint = Relay.makeTokenEndpoint(loop: loop, preflight: preflight)
        endpoint.dpop = dpop
        coordinator = try Relay.makeCoordinator(loop: loop, preflight: preflight, endpoint: endpoint,
                                                metrics: identityMetrics, redactor: redactor, logger: logger)
        coordinator.dpop = dpop
        try Relay.keepDPoPKeyInRecord(coordinator, dpop: dpop, preflight: preflight, logger: logger)
        self.loop = loop
        self.logger = logger
        credentialKeys = preflight.credentialKeys
        clientSecret = preflight.clientSecret
        refreshTLS = preflight.refreshTLS
    }

    func start() {
        coordinator.start(watchInterval: config.tokens.watchIntervalSeconds)
        watchCredentialFiles()
        watchClientSecret()
    }

    private func watchClientSecret() {
        secretWatch = ClientSecretWatch(source: config.refresh.clientSecret, loop: loop, interval: config.tokens.watchIntervalSeconds,
                                        logger: logger) { [unowned self] secret in
            self.redactor.add(secret)
            self.clientSecret = secret
            self.reconfigureTokenEndpoint()
            Relay.retry(self.coordinator, afterCredentialChange: "client secret file replaced", logger: self.logger)
        }
    }

    private func reconfigureTokenEndpoint() {
        endpoint.reconfigure(connection: Relay.tokenEndpointConnection(config: config, tls: refreshTLS),
                             grant: TokenGrants.make(config.refresh, clientSecret: clientSecret, keys: credentialKeys))
    }

    private func watchCredentialFiles() {
        credentialFilesWatch = CredentialFilesWatch(settings: config.refresh, loop: loop, interval: config.tokens.watchIntervalSeconds) {
            [unowned self] field in Relay.retry(self.coordinator, afterCredentialChange: "\(field) replaced", logger: self.logger)
        }
    }

    /// A reload removed this identity: its files are no longer watched (its machine is stopped by the
    /// proxy) and its metrics leave /metrics.
    func retire() {
        secretWatch = nil
        credentialFilesWatch = nil
        metrics.retire()
    }

    /// A reload that keeps this identity: its refresh settings, client secret, keys and token endpoint TLS
    /// apply from the next exchange on; the token store, the machine and a refresh in flight stay (the
    /// reload plan keeps the running token settings).
    func apply(_ named: NamedPreflight) {
        let preflight = named.preflight
        let credentialChange = Relay.credentialChange(from: (config.refresh, credentialKeys), to: (preflight.config.refresh, preflight.credentialKeys))
            ?? (preflight.clientSecret != clientSecret ? "a new client secret" : nil)
        credentialKeys = preflight.credentialKeys
        // The token settings and the DPoP key stay as they run until a restart (the reload plan keeps
        // `identities.NAME.tokens` and `.dpop` and says so): the watches and the lock lifetime follow them too.
        var next = preflight.config
        next.tokens = config.tokens
        next.dpop = config.dpop
        config = next
        redactor.add(preflight.clientSecret)
        clientSecret = preflight.clientSecret
        refreshTLS = preflight.refreshTLS
        reconfigureTokenEndpoint()
        coordinator.apply(settings: config.refresh, injection: config.inject, refreshTimeout: config.timeouts.refreshSeconds,
                          lockTimeout: RefreshCoordinator.lockTimeout(for: config),
                          lockLifetime: config.tokens.redis?.effectiveLockSeconds(refreshSeconds: config.timeouts.refreshSeconds))
        watchCredentialFiles()
        watchClientSecret()
        if let credentialChange { Relay.retry(coordinator, afterCredentialChange: "reload: \(credentialChange)", logger: logger) }
    }
}

extension Relay {
    static func makeTokenEndpoint(loop: EventLoop, preflight: Preflight) -> TokenEndpointClient {
        TokenEndpointClient(loop: loop, connection: tokenEndpointConnection(config: preflight.config, tls: preflight.refreshTLS),
                            grant: TokenGrants.make(preflight.config.refresh, clientSecret: preflight.clientSecret, keys: preflight.credentialKeys))
    }

    /// The refresh coordinator of the identity `preflight` was run for, over its token store.
    static func makeCoordinator(loop: EventLoop, preflight: Preflight, endpoint: TokenEndpointClient, metrics: RelayMetrics,
                                redactor: SecretRedactor, logger: Logger) throws -> RefreshCoordinator {
        let config = preflight.config
        let store = try tokenStore(loop: loop, preflight: preflight)
        if let file = store as? FileTokenStore {
            let name = file.name
            file.onLeftovers = { StartupLeftoverRecovery.log($0, file: name, logger: logger) }
        }
        return RefreshCoordinator(loop: loop, endpoint: endpoint, store: store,
                                  initialTokens: preflight.tokens,
                                  settings: config.refresh, injection: config.inject, lockTimeout: RefreshCoordinator.lockTimeout(for: config),
                                  refreshTimeout: config.timeouts.refreshSeconds,
                                  storeWriteTimeout: config.tokens.redis?.writeTimeoutSeconds ?? 0,
                                  cache: preflight.redis == nil ? nil : preflight.tokenFile,
                                  metrics: metrics, redactor: redactor, logger: logger)
    }
}
