import JOSE
import Logging

extension TokenSet {
    /// Token-state fields of DPoP (kept with the tokens, sealed with them under `tokens.encryption`):
    /// the generated key (PKCS#8 PEM) when `dpop.key_file` is not given, and the thumbprint of the key the
    /// stored tokens are bound to (only for tokens issued as `token_type: DPoP`).
    static let dpopKeyField = "dpop_key"
    static let dpopThumbprintField = "dpop_jkt"

    /// The thumbprint of the key these tokens are bound to, if they are DPoP-bound.
    var dpopBoundThumbprint: String? { otherFields[Self.dpopThumbprintField] as? String }
}

/// Where the DPoP key comes from (`dpop.key_file`, or the token state), loaded before the loop runs
/// (a file read, and for a new key a generation: never on the loop).
struct DPoPKeySource {
    let key: SigningKey
    /// The key was generated now and must be written with the token state before it signs anything a
    /// server could bind tokens to.
    let generated: Bool

    /// `tokens`: the stored state, which holds a generated key (and gets a new one when it has none).
    static func load(_ settings: DPoPSettings, tokens: inout TokenSet, generate: Bool) throws -> DPoPKeySource {
        if let path = settings.keyFile {
            let key: SigningKey
            do {
                key = try SigningKey.load(pemFile: path)
                try key.check(settings.alg)
            } catch {
                throw ConfigError("dpop.key_file", "\(error)")
            }
            return DPoPKeySource(key: key, generated: false)
        }
        if let pem = tokens.otherFields[TokenSet.dpopKeyField] as? String {
            let key: SigningKey
            do {
                key = try SigningKey.load(pem: Array(pem.utf8))
            } catch {
                throw ConfigError("dpop", "the key kept with the token state (\(TokenSet.dpopKeyField)) cannot be read: \(error)")
            }
            do {
                try key.check(settings.alg)
            } catch {
                throw ConfigError("dpop.alg", "\(error) (the key kept with the token state; set dpop.key_file or remove \(TokenSet.dpopKeyField) and log in again)")
            }
            return DPoPKeySource(key: key, generated: false)
        }
        guard generate else {
            // `check`: nothing is written; run generates it.
            return DPoPKeySource(key: try SigningKey.generate(for: settings.alg), generated: true)
        }
        let key = try SigningKey.generate(for: settings.alg)
        tokens.otherFields[TokenSet.dpopKeyField] = String(decoding: try key.privateKeyPEM(), as: UTF8.self)
        return DPoPKeySource(key: key, generated: true)
    }

    /// The one line for tokens bound to another key than this one (a new `key_file`): nil when they match.
    static func keyChange(tokens: TokenSet, key: SigningKey) -> String? {
        guard let bound = tokens.dpopBoundThumbprint, bound != key.thumbprint else { return nil }
        return "dpop: the key changed (the stored tokens are bound to jkt \(bound), the key is jkt \(key.thumbprint)): "
            + "the bound refresh token is not presented with the wrong key; run tokenrelay login"
    }
}

extension Relay {
    /// The DPoP runtime for `dpop`, its key loaded or generated (before the loop runs). A generated key
    /// goes into `tokens` and is written with the first tokens bound to it (one write: a key and the tokens
    /// bound to it are never stored apart). Tokens bound to another key get one line here; their refresh
    /// token is never presented (`TokenEndpointClient` asks for a new login instead).
    /// `fleet`: with `tokens.redis` the key is kept in the Redis record (`DPoPFleetKey`), not in the token file.
    static func dpopProofs(config: Config, tokens: inout TokenSet, fleet: DPoPFleetKey?, metrics: RelayMetrics, logger: Logger) throws -> DPoPProofs? {
        guard let settings = config.dpop else { return nil }
        let source: DPoPKeySource
        if settings.keyFile == nil, let fleet {
            source = try fleet.source(settings, tokens: &tokens, logger: logger)
        } else {
            source = try DPoPKeySource.load(settings, tokens: &tokens, generate: true)
        }
        let signer: ProofSigner
        do {
            signer = try ProofSigner(key: source.key, alg: settings.alg)
        } catch {
            throw ConfigError(settings.keyFile == nil ? "dpop.alg" : "dpop.key_file", "\(error)")
        }
        if let line = DPoPKeySource.keyChange(tokens: tokens, key: source.key) {
            logger.warning("\(line)")
        }
        if source.generated {
            logger.info("dpop: generated a \(settings.alg.rawValue) key (jkt \(source.key.thumbprint)); it is kept with the token state\(fleet == nil ? "" : " in Redis")")
        }
        if settings.keyFile == nil && config.tokens.encryption == nil {
            logger.warning("dpop: the generated key is stored in clear with the token state (set tokens.encryption to seal it)")
        }
        let kept = settings.keyFile == nil ? tokens.otherFields[TokenSet.dpopKeyField] as? String : nil
        return DPoPProofs(signer: signer, metrics: metrics, logger: logger, keptKeyPEM: kept)
    }
}
