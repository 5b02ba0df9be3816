import FoundationEssentials
import JOSE

/// The token state sealed at rest: the whole stored document (tokens, expiry, every other field such as a
/// DPoP key) encrypted with AES-256-GCM and stored as a JSON object of its own, an extension of the
/// token-file format that a plain token file can never be mistaken for:
///
///     {"sealed": {"version": 1, "alg": "A256GCM", "key_id": "<16 hex>", "nonce": "<base64url, 12 bytes>",
///                 "ciphertext": "<base64url of ciphertext followed by the 16-byte tag>"}}
///
/// The associated data names the place the state belongs to (`TokenStatePlace`): a value copied from one
/// Redis key to another, or from a fleet's cache into a token file, fails its tag instead of opening as
/// another identity's session.
enum SealedTokenState {
    static let version = 1
    static let algorithm = "A256GCM"
    static let nonceBytes = 12
    static let tagBytes = 16

    /// Whether `object` (a parsed stored document) is a sealed envelope rather than a plain token file.
    static func isSealed(_ object: [String: Any]) -> Bool { object["sealed"] != nil }

    static func seal(_ plaintext: [UInt8], key: SealingKey, associatedData: [UInt8]) throws -> Data {
        let nonce = SecureRandom.bytes(nonceBytes)
        let sealed = try AESGCM.seal(key: key.bytes, nonce: nonce, plaintext: plaintext, associatedData: associatedData)
        let envelope: [String: Any] = ["sealed": [
            "version": version, "alg": algorithm, "key_id": key.id,
            "nonce": Base64URL.encode(nonce), "ciphertext": Base64URL.encode(sealed.ciphertext + sealed.tag),
        ] as [String: Any]]
        return Data(try JSONWriter.data(envelope, options: [.prettyPrinted, .sortedKeys]))
    }

    /// The plaintext document, and the id of the key that opened it. Every refusal is one line that names
    /// no key and quotes no sealed byte.
    static func open(_ object: [String: Any], keyring: SealingKeyring, associatedData: [UInt8]) throws(SealedStateError) -> (plaintext: [UInt8], keyID: String) {
        guard object.count == 1, let envelope = object["sealed"] as? [String: Any] else {
            throw .malformed("a sealed token state holds one object, \"sealed\", and nothing beside it")
        }
        guard let number = envelope["version"] as? JSONNumber, number.doubleValue == Double(version) else {
            throw .malformed("sealed.version is not \(version)")
        }
        guard envelope["alg"] as? String == algorithm else { throw .malformed("sealed.alg is not \(algorithm)") }
        guard let keyID = envelope["key_id"] as? String, !keyID.isEmpty else { throw .malformed("sealed.key_id is missing") }
        guard let nonceText = envelope["nonce"] as? String, let nonce = Base64URL.decode(Substring(nonceText)), nonce.count == nonceBytes else {
            throw .malformed("sealed.nonce is not base64url of \(nonceBytes) bytes")
        }
        guard let sealedText = envelope["ciphertext"] as? String, let sealed = Base64URL.decode(Substring(sealedText)), sealed.count > tagBytes else {
            throw .malformed("sealed.ciphertext is not base64url of a ciphertext and its tag (truncated?)")
        }
        guard let key = keyring.key(id: keyID) else {
            throw .unknownKey(keyID)
        }
        do {
            let plaintext = try AESGCM.open(key: key.bytes, nonce: nonce, ciphertext: Array(sealed.dropLast(tagBytes)),
                                            tag: Array(sealed.suffix(tagBytes)), associatedData: associatedData)
            return (plaintext, keyID)
        } catch {
            throw .tagMismatch
        }
    }
}

enum SealedStateError: Error {
    case malformed(String)
    case unknownKey(String)
    case tagMismatch
}

/// Where a stored token state belongs, bound into its seal.
enum TokenStatePlace: Sendable, Equatable {
    /// `tokens.file` holding the tokens (one host).
    case tokenFile
    /// `identities.<name>.tokens.file`: a file copied from another identity's path fails its tag instead of
    /// opening as this identity's session.
    case identityTokenFile(name: String)
    /// The Redis value under this key (fleet mode).
    case redis(key: String)
    /// `tokens.file` as the local cache of the Redis key (fleet mode).
    case redisCache(key: String)

    var associatedData: [UInt8] {
        switch self {
        case .tokenFile: return Array("tokenrelay token state v1: token file".utf8)
        case .identityTokenFile(let name): return Array("tokenrelay token state v1: token file of identity \(name)".utf8)
        case .redis(let key): return Array("tokenrelay token state v1: redis key \(key)".utf8)
        case .redisCache(let key): return Array("tokenrelay token state v1: local cache of redis key \(key)".utf8)
        }
    }

    /// What builds before identity binding sealed this place with (named identities' files were sealed as
    /// plain `token file`s): still opened, so an upgrade reads the files it finds; the next write binds it.
    var legacyAssociatedData: [UInt8]? {
        if case .identityTokenFile = self { return TokenStatePlace.tokenFile.associatedData }
        return nil
    }
}
