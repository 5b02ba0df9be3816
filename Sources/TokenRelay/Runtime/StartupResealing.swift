import Logging

/// `run` with `tokens.encryption`: a token file found plain (hand-seeded, or from before encryption was
/// configured) or sealed with a previous key is rewritten sealed with `tokens.encryption.key_file` at
/// start, before the event loop runs, so no token stays on disk in clear (or under a retired key) until
/// the next refresh happens to write it.
///
/// Under the token file lock, and from a fresh read: another process (a refreshing relay, `token import`)
/// may have written the file since the preflight read it, and what is rewritten must be what is there
/// now, never the older tokens the preflight saw (the race: a rotation lands between the two reads, and
/// rewriting the older copy would put a burnt refresh token back).
enum StartupResealing {
    /// How long the lock is waited for: a refresh holding it ends within its timeout; past that the file
    /// is left to the next write, which seals it too.
    ///
    /// Throws only when the stored state cannot be opened (an unknown key, a failed tag): `run` then stops
    /// with that one line, and nothing is written over it.
    ///
    /// Every identity's store is resealed, each under its own lock and with its own keys: a named identity's
    /// file left plain would otherwise keep its tokens in clear until its own next refresh.
    static func reseal(_ preflight: Preflight, logger: Logger) throws -> Preflight {
        let resealed = try resealStore(preflight, logger: logger)
        for named in preflight.identities {
            var identityLogger = logger
            identityLogger[metadataKey: "identity"] = "\(named.name)"
            named.preflight = try resealStore(named.preflight, logger: identityLogger)
        }
        return resealed
    }

    /// One identity's token file or Redis value.
    private static func resealStore(_ preflight: Preflight, logger: Logger) throws -> Preflight {
        if let endpoint = preflight.redis, let settings = preflight.config.tokens.redis, preflight.codecs.sealer != nil {
            try resealRedis(endpoint: endpoint, settings: settings, codec: preflight.codecs.redis, logger: logger)
        }
        guard preflight.redis == nil, let file = preflight.tokenFile, let form = preflight.tokenForm,
              file.codec.needsResealing(form) else { return preflight }
        // The read is checked as at start (a state that stopped opening stops `run`); a failed write only
        // leaves the file as it was, for the next write to seal.
        var result: Result<(tokens: TokenSet, found: StoredTokenForm, writeError: (any Error)?)?, any Error> = .success(nil)
        do {
            try TokenFileLock.withBlockingLock(tokenFilePath: file.path, timeout: preflight.config.timeouts.refreshSeconds + 5) {
                result = Result {
                    guard !file.isAbsentOrEmpty else { return nil }
                    try file.checkPermissions()
                    let (tokens, found) = try file.loadWithForm()
                    guard file.codec.needsResealing(found) else { return (tokens, found, nil) }
                    do {
                        try file.write(tokens)
                        return (tokens, found, nil)
                    } catch {
                        return (tokens, found, error)
                    }
                }
            }
        } catch {
            logger.warning("token file not resealed at start; the next write seals it", metadata: ["error": "\(error)"])
            return preflight
        }
        guard let read = try result.get() else { return preflight }
        var resealed = preflight
        resealed.tokens = read.tokens
        resealed.tokenForm = read.found
        if let writeError = read.writeError {
            logger.warning("token file not resealed at start; the next write seals it", metadata: ["error": "\(writeError)"])
        } else if file.codec.needsResealing(read.found) {
            logger.info("token file sealed with tokens.encryption.key_file", metadata: ["file": "\(file.path)", "was": "\(describe(read.found))"])
            resealed.tokenForm = file.codec.sealer.map { .sealed(keyID: $0.keyring.current.id) }
        }
        return resealed
    }

    private static func describe(_ form: StoredTokenForm) -> String {
        switch form {
        case .plain: return "plain JSON"
        case .sealed(let keyID): return "sealed with the previous key \(keyID)"
        }
    }

    /// Redis may be out of reach at start (the fleet serves from its cache meanwhile): then the value is
    /// sealed by the next write instead. One bounded exchange (twice the command timeout).
    private static func resealRedis(endpoint: RedisEndpoint, settings: RedisSettings, codec: TokenStateCodec, logger: Logger) throws {
        do {
            let master = try RedisSentinelTarget.resolveBlocking(settings: settings, endpoint: endpoint)
            switch try RedisTokenResealing.reseal(endpoint: master, settings: settings, codec: codec) {
            case .resealed(let form, let version):
                logger.info("Redis token value sealed with tokens.encryption.key_file",
                            metadata: ["key": "\(settings.key)", "was": "\(describe(form))", "version": "\(version)"])
            case .alreadySealed, .empty, .newerVersionStored:
                break
            }
        } catch let error as TokenFileError {
            throw error
        } catch {
            logger.warning("Redis token value not resealed at start; the next write seals it", metadata: ["error": "\(error)"])
        }
    }
}
