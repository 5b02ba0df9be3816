import FoundationEssentials
import Synchronization

/// The keys a running relay seals with, replaceable by a reload (a rotated key file) while the stores that
/// hold this box keep working: reads and writes take the keys in force at that moment.
final class TokenSealer: Sendable {
    private let keys: Mutex<SealingKeyring>

    init(_ keyring: SealingKeyring) { keys = Mutex(keyring) }

    var keyring: SealingKeyring { keys.withLock { $0 } }

    func use(_ keyring: SealingKeyring) { keys.withLock { $0 = keyring } }
}

/// How a stored token state was found: what a reader needs to know to rewrite it with the current key.
enum StoredTokenForm: Equatable {
    case plain
    case sealed(keyID: String)
}

/// The (de)serialisation boundary of the token stores: a token set to the bytes stored (a token file, a
/// Redis value) and back, sealed when `tokens.encryption` is configured. The stores' own logic — locking,
/// compare-and-set, markers — never sees the difference.
///
/// With a sealer a plain document is still read (a hand-seeded file, one from before encryption was
/// configured): the caller rewrites it sealed. Without one a sealed document is refused with a line saying
/// what to configure.
struct TokenStateCodec: Sendable {
    let sealer: TokenSealer?
    let place: TokenStatePlace

    static let plain = TokenStateCodec(sealer: nil, place: .tokenFile)

    init(sealer: TokenSealer?, place: TokenStatePlace) {
        self.sealer = sealer
        self.place = place
    }

    func encode(_ tokens: TokenSet, expiryMilliseconds: Bool = false) throws -> Data {
        let document = try TokenFile.encode(tokens, expiryMilliseconds: expiryMilliseconds)
        guard let sealer else { return document }
        return try SealedTokenState.seal(Array(document), key: sealer.keyring.current, associatedData: place.associatedData)
    }

    func decode(_ data: Data, name: String) throws -> TokenSet {
        try decodeWithForm(data, name: name).tokens
    }

    /// `name` is the file's path or `redis:<key>`, for the error line.
    func decodeWithForm(_ data: Data, name: String) throws -> (tokens: TokenSet, form: StoredTokenForm) {
        // Cheap test first: only a document that parses as an object with "sealed" is an envelope; anything
        // else goes to the plain decoder, which gives its usual errors.
        guard let object = (try? StrictJSON.parse(data)) as? [String: Any], SealedTokenState.isSealed(object) else {
            return (try TokenFile.decode(data, path: name), .plain)
        }
        guard let sealer else {
            throw Self.refused(name, "is sealed (AES-256-GCM); tokens.encryption.key_file must name its key to read it")
        }
        let keyring = sealer.keyring
        do {
            let opened: (plaintext: [UInt8], keyID: String)
            do {
                opened = try SealedTokenState.open(object, keyring: keyring, associatedData: place.associatedData)
            } catch .tagMismatch {
                guard let legacy = place.legacyAssociatedData else { throw SealedStateError.tagMismatch }
                opened = try SealedTokenState.open(object, keyring: keyring, associatedData: legacy)
            }
            return (try TokenFile.decode(Data(opened.plaintext), path: name), .sealed(keyID: opened.keyID))
        } catch let error as SealedStateError {
            switch error {
            case .malformed(let reason):
                throw Self.refused(name, "\(reason); refused and left as it is")
            case .unknownKey(let id):
                let previous = keyring.previous.isEmpty ? "" : " nor any of the previous_key_files"
                throw Self.refused(name, "is sealed with key id \(id), which is not \(keyring.field) (key id \(keyring.current.id))"
                    + "\(previous); refused and left as it is")
            case .tagMismatch:
                throw Self.refused(name, "sealed token state does not open with the key of its key id: the authentication tag "
                    + "does not match (truncated, altered, or moved from another place); refused and left as it is")
            }
        }
    }

    private static func refused(_ name: String, _ reason: String) -> TokenFileError {
        var error = TokenFileError(name, reason)
        error.sealedStateRefused = true
        return error
    }

    /// Whether a state found in `form` should be written again: plain, or sealed with a previous key.
    func needsResealing(_ form: StoredTokenForm) -> Bool {
        guard let sealer else { return false }
        return form != .sealed(keyID: sealer.keyring.current.id)
    }
}

/// The codecs a config asks for, its keys loaded (blocking file reads: at start, in a one-shot command, or
/// on a reload's helper thread): one for `tokens.file` (the token file, or a fleet's local cache) and one
/// for the Redis value. All share one sealer, so a reload's new keys reach both.
struct ConfiguredTokenCodecs: Sendable {
    let sealer: TokenSealer?
    let file: TokenStateCodec
    let redis: TokenStateCodec

    init(_ tokens: Config.Tokens) throws {
        sealer = try SealingKeyring.load(tokens.encryption).map(TokenSealer.init)
        if let key = tokens.redis?.key {
            file = TokenStateCodec(sealer: sealer, place: .redisCache(key: key))
            redis = TokenStateCodec(sealer: sealer, place: .redis(key: key))
        } else {
            file = TokenStateCodec(sealer: sealer, place: tokens.identity.map { .identityTokenFile(name: $0) } ?? .tokenFile)
            redis = .plain
        }
    }
}
