import Logging

extension Relay {
    /// The key for `dpop`, loaded or generated: blocking (a file read, a generation, in fleet mode a Redis
    /// one-shot), so before the loop runs, or for a reload's identities on its helper thread. A generated key
    /// goes into `tokens` and is written with the first tokens bound to it (one write: a key and the tokens
    /// bound to it are never stored apart). `fleet`: with `tokens.redis` the key is kept in the Redis record
    /// (`DPoPFleetKey`), not in the token file.
    static func dpopKeySource(config: Config, tokens: inout TokenSet, fleet: DPoPFleetKey?, logger: Logger) throws -> DPoPKeySource? {
        guard let settings = config.dpop else { return nil }
        if settings.keyFile == nil, let fleet {
            return try fleet.source(settings, tokens: &tokens, logger: logger)
        }
        return try DPoPKeySource.load(settings, tokens: &tokens, generate: true)
    }

    /// The DPoP runtime for `dpop` over its loaded key. Tokens bound to another key get one line here; their
    /// refresh token is never presented (`TokenEndpointClient` asks for a new login instead).
    static func dpopProofs(config: Config, source: DPoPKeySource?, tokens: TokenSet, metrics: RelayMetrics, logger: Logger) throws -> DPoPProofs? {
        guard let settings = config.dpop, let source else { return nil }
        let signer: ProofSigner
        do {
            signer = try ProofSigner(key: source.key, alg: settings.alg)
        } catch {
            throw ConfigError(settings.keyFile == nil ? "dpop.alg" : "dpop.key_file", "\(error)")
        }
        if let line = DPoPKeySource.keyChange(tokens: tokens, key: source.key) {
            logger.warning("\(line)")
        }
        let place = config.tokens.redis == nil ? "" : " in Redis"
        if source.generated {
            logger.info("dpop: generated a \(settings.alg.rawValue) key (jkt \(source.key.thumbprint)); it is kept with the token state\(place)")
        }
        if let warning = clearKeyWarning(config) { logger.warning("\(warning)") }
        let kept = settings.keyFile == nil ? tokens.otherFields[TokenSet.dpopKeyField] as? String : nil
        return DPoPProofs(signer: signer, metrics: metrics, logger: logger, keptKeyPEM: kept)
    }

    /// Fleet mode with the key kept in the Redis record: the store's writes put it back (HSETNX) when the
    /// record lost the field (`RedisTokenStore.dpopKeyField`). Sealed once here, as `DPoPFleetKey` seals it.
    static func keepDPoPKeyInRecord(_ coordinator: RefreshCoordinator, dpop: DPoPProofs?, preflight: Preflight, logger: Logger) throws {
        guard let store = coordinator.store as? RedisTokenStore, preflight.config.dpop?.keyFile == nil, let pem = dpop?.keptKeyPEM,
              let endpoint = preflight.redis, let settings = preflight.config.tokens.redis else { return }
        let fleetKey = DPoPFleetKey(endpoint: endpoint, settings: settings, codec: preflight.codecs.redis)
        store.dpopKeyField = try fleetKey.encode(pem)
        // A key taken with adopted tokens (`DPoPProofs.adoptKey`) is the one the record's tokens are bound to now.
        dpop?.onKeyAdopted = { [weak store] adopted in
            if let field = try? fleetKey.encode(adopted) { store?.dpopKeyField = field }
        }
        store.onDPoPKeyStored = {
            logger.warning("dpop: the Redis record had lost its \(DPoPFleetKey.field) field (a flush or a recreated record); stored the key this relay signs with again")
        }
    }

    /// `dpop` without `key_file` and no `tokens.encryption`: the generated key is stored as readable PEM.
    static func clearKeyWarning(_ config: Config) -> String? {
        guard let settings = config.dpop, settings.keyFile == nil, config.tokens.encryption == nil else { return nil }
        let place = config.tokens.redis == nil ? "with the token state" : "in the Redis record (and its local cache)"
        return "dpop: the generated key is stored in clear \(place) (set tokens.encryption to seal it)"
    }
}

extension NamedPreflight {
    /// This identity's DPoP key (`identities.<name>.dpop`), loaded off the loop: at start before it runs, on a
    /// reload on the helper thread that checked the config.
    func loadDPoPKey(logger: Logger) throws {
        guard preflight.config.dpop != nil else { return }
        var logger = logger
        logger[metadataKey: "identity"] = "\(name)"
        let fleet = preflight.redis.flatMap { endpoint in
            preflight.config.tokens.redis.map { DPoPFleetKey(endpoint: endpoint, settings: $0, codec: preflight.codecs.redis) }
        }
        do {
            dpopKey = try Relay.dpopKeySource(config: preflight.config, tokens: &preflight.tokens, fleet: fleet, logger: logger)
        } catch let error as ConfigError {
            throw error.underIdentity(name)
        }
    }
}
