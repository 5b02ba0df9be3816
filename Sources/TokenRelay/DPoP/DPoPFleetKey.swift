import FoundationEssentials
import JOSE
import Logging

/// Fleet mode without `dpop.key_file`: the generated key is kept in the Redis record itself (the field
/// `dpop_key` of the token hash, sealed like the tokens under `tokens.encryption`), so every relay signs with
/// the one key the shared tokens are bound to. Settled once at start, before the loop serves (a blocking
/// one-shot, as the command line's Redis work is), and by `login`.
struct DPoPFleetKey {
    let endpoint: RedisEndpoint
    let settings: RedisSettings
    /// The Redis value's codec: the key is sealed exactly as the tokens are.
    let codec: TokenStateCodec

    static let field = "dpop_key"

    /// HSETNX and the read back in one atomic step. Two relays starting at once on an empty record race
    /// here: the first write stays, the second HSETNX is a no-op, and both read the same (the first) key.
    /// A plain SET would let the second overwrite a key the first may already have signed a token request with.
    static let storeIfAbsent = "redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) return redis.call('HGET', KEYS[1], ARGV[1])"

    /// The key every relay signs with: the stored one, or `generated: true` when this process stored its own.
    func settle(_ dpop: DPoPSettings) throws -> (key: SigningKey, pem: String, generated: Bool) {
        let timeout = settings.commandTimeoutSeconds * 2
        // With `sentinel`, the master the sentinels name now (the key is written there, like the tokens).
        let endpoint = try RedisSentinelTarget.resolveBlocking(settings: settings, endpoint: self.endpoint)
        if case .string(let stored) = try RedisOneShot.run(endpoint: endpoint, timeout: timeout, ["HGET", settings.key, Self.field]) {
            let (key, pem) = try open(stored, alg: dpop.alg)
            return (key, pem, false)
        }
        // The field gone while the token set is there (a Redis restarted without persistence or flushed,
        // and the relays put back the set they held, which carries the key: `DPoPProofs.keepingItsKey`):
        // that key is stored again. Race it prevents: a relay starting after the put-back generated a key
        // of its own, which the fleet's tokens are not bound to, and presented the bound refresh token with it.
        let recovered = try keyInTokenSet(endpoint: endpoint, timeout: timeout, alg: dpop.alg)
        let candidate = try recovered?.key ?? SigningKey.generate(for: dpop.alg)
        let candidatePEM = try recovered?.pem ?? String(decoding: candidate.privateKeyPEM(), as: UTF8.self)
        let sealed = try encode(candidatePEM)
        let arguments = ["EVAL", Self.storeIfAbsent, "1", settings.key, Self.field].map { Data($0.utf8) } + [sealed]
        switch try RedisOneShot.run(endpoint: endpoint, timeout: timeout, arguments) {
        case .string(let winner):
            let (key, pem) = try open(winner, alg: dpop.alg)
            return (key, pem, recovered == nil && key.thumbprint == candidate.thumbprint)
        case .error(let message):
            throw RedisStoreError(description: "Redis: \(message)")
        default:
            throw RedisStoreError(description: "unexpected reply from Redis")
        }
    }

    /// The key kept in the record's token set (`tokens`), when it holds one this alg can sign with.
    private func keyInTokenSet(endpoint: RedisEndpoint, timeout: Double, alg: JWSAlgorithm) throws -> (key: SigningKey, pem: String)? {
        guard case .string(let value) = try RedisOneShot.run(endpoint: endpoint, timeout: timeout, ["HGET", settings.key, "tokens"]),
              let held = try? codec.decode(value, name: "redis:\(settings.key)"),
              let pem = held.otherFields[TokenSet.dpopKeyField] as? String,
              let key = try? SigningKey.load(pem: Array(pem.utf8)), (try? key.check(alg)) != nil else { return nil }
        return (key, pem)
    }

    /// What the field holds: `{"dpop_key": PEM}`, sealed (its own associated data: a sealed token value
    /// moved into this field does not open as a key) when `tokens.encryption` is set.
    private var associatedData: [UInt8] { Array("tokenrelay dpop key v1: redis key \(settings.key)".utf8) }
    private var place: String { "the key kept in Redis (\(settings.key) field \(Self.field))" }

    func encode(_ pem: String) throws -> Data {
        let document = try JSONWriter.data([TokenSet.dpopKeyField: pem])
        guard let sealer = codec.sealer else { return Data(document) }
        return try SealedTokenState.seal(Array(document), key: sealer.keyring.current, associatedData: associatedData)
    }

    private func open(_ stored: Data, alg: JWSAlgorithm) throws -> (SigningKey, String) {
        guard var object = (try? StrictJSON.parse(stored)) as? [String: Any] else { throw ConfigError("dpop", "\(place) is not a JSON object") }
        if SealedTokenState.isSealed(object) {
            guard let sealer = codec.sealer else {
                throw ConfigError("dpop", "\(place) is sealed; tokens.encryption.key_file must name its key to read it")
            }
            do {
                let opened = try SealedTokenState.open(object, keyring: sealer.keyring, associatedData: associatedData)
                object = (try? StrictJSON.parse(Data(opened.plaintext))) as? [String: Any] ?? [:]
            } catch .malformed(let reason) {
                throw ConfigError("dpop", "\(place): \(reason)")
            } catch .unknownKey(let id) {
                throw ConfigError("dpop", "\(place) is sealed with key id \(id), which is none of tokens.encryption's keys")
            } catch .tagMismatch {
                throw ConfigError("dpop", "\(place) does not open with the key of its key id (altered, or moved from another place)")
            }
        }
        guard let pem = object[TokenSet.dpopKeyField] as? String else { throw ConfigError("dpop", "\(place) holds no key") }
        let key: SigningKey
        do {
            key = try SigningKey.load(pem: Array(pem.utf8))
        } catch {
            throw ConfigError("dpop", "\(place) cannot be read: \(error)")
        }
        do {
            try key.check(alg)
        } catch {
            throw ConfigError("dpop.alg", "\(error) (\(place); set dpop.key_file or delete that field and log in again)")
        }
        return (key, pem)
    }
}

extension DPoPFleetKey {
    /// The start's key source in fleet mode. Redis unreachable at start: the key the local cache holds (it is
    /// written with every token set), else no start — signing with a key of our own would bind this relay's
    /// next tokens to a key the rest of the fleet does not have.
    func source(_ dpop: DPoPSettings, tokens: inout TokenSet, logger: Logger) throws -> DPoPKeySource {
        do {
            let settled = try settle(dpop)
            if !settled.generated, let cached = tokens.otherFields[TokenSet.dpopKeyField] as? String, cached != settled.pem {
                logger.info("dpop: the local cache held another key than the one kept in Redis; the Redis one is used")
            }
            tokens.otherFields[TokenSet.dpopKeyField] = settled.pem
            return DPoPKeySource(key: settled.key, generated: settled.generated)
        } catch let error as RedisStoreError {
            guard tokens.otherFields[TokenSet.dpopKeyField] is String else {
                throw ConfigError("dpop", "the key kept in Redis cannot be read (\(error)); start again once Redis answers, or set dpop.key_file")
            }
            logger.warning("dpop: the key kept in Redis cannot be read (\(error)); signing with the key of the local cache \(settings.key)")
            var cached = tokens
            return try DPoPKeySource.load(dpop, tokens: &cached, generate: false)
        }
    }
}
