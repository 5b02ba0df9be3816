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
