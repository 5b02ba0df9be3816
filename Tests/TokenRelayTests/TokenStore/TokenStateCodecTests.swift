import Foundation
import XCTest
@testable import TokenRelay

/// The sealed token state at the (de)serialisation boundary, in-process: what is stored, what opens where,
/// and the one-line refusals.
final class TokenStateCodecTests: XCTestCase {
    private let keyA = SealingKey(bytes: Array(repeating: 0xA1, count: 32))
    private let keyB = SealingKey(bytes: Array(repeating: 0xB2, count: 32))

    private func codec(_ current: SealingKey, previous: [SealingKey] = [], place: TokenStatePlace = .tokenFile) -> TokenStateCodec {
        TokenStateCodec(sealer: TokenSealer(SealingKeyring(current: current, previous: previous)), place: place)
    }

    private let tokens = TokenSet(accessToken: "access-token-visible-AAAA", refreshToken: "refresh-token-visible-BBBB",
                                  expiresAt: Date(timeIntervalSince1970: 1_900_000_000),
                                  otherFields: ["dpop_private_key": "-----BEGIN PRIVATE KEY-----MIGH", "note": "kept"])

    func testTheWholeDocumentIsSealedAndOpensBackWithEveryField() throws {
        let sealed = try codec(keyA).encode(tokens)
        let text = String(decoding: sealed, as: UTF8.self)
        for visible in ["access-token", "refresh-token", "BEGIN PRIVATE KEY", "dpop_private_key", "note", "expires_at"] {
            XCTAssertFalse(text.contains(visible), visible)
        }
        let (opened, form) = try codec(keyA).decodeWithForm(sealed, name: "t.json")
        XCTAssertEqual(form, .sealed(keyID: keyA.id))
        XCTAssertEqual(opened.accessToken, tokens.accessToken)
        XCTAssertEqual(opened.refreshToken, tokens.refreshToken)
        XCTAssertEqual(opened.expiresAt, tokens.expiresAt)
        XCTAssertEqual(opened.otherFields["dpop_private_key"] as? String, "-----BEGIN PRIVATE KEY-----MIGH")
        XCTAssertEqual(opened.otherFields["note"] as? String, "kept")
        XCTAssertFalse(codec(keyA).needsResealing(form))
    }

    func testEveryWriteHasItsOwnNonce() throws {
        let nonces = try (0..<50).map { _ -> String in
            let object = try XCTUnwrap(JSONSerialization.jsonObject(with: try codec(keyA).encode(tokens)) as? [String: Any])
            return try XCTUnwrap((object["sealed"] as? [String: Any])?["nonce"] as? String)
        }
        XCTAssertEqual(Set(nonces).count, 50)
    }

    func testTheKeyIdIsTheFirstEightBytesOfTheKeysSHA256() {
        // python3 -c "import hashlib; print(hashlib.sha256(bytes([0xa1]*32)).hexdigest()[:16])"
        XCTAssertEqual(keyA.id, "52fe6094743bfd4f")
        XCTAssertEqual(keyA.id.count, 16)
    }

    func testASealedValueDoesNotOpenInAnotherPlace() throws {
        let redisA = try codec(keyA, place: .redis(key: "tokenrelay:a")).encode(tokens)
        for place in [TokenStatePlace.redis(key: "tokenrelay:b"), .tokenFile, .redisCache(key: "tokenrelay:a")] {
            XCTAssertThrowsError(try codec(keyA, place: place).decode(redisA, name: "x")) { error in
                XCTAssertTrue("\(error)".contains("authentication tag does not match"), "\(error)")
            }
        }
        XCTAssertNoThrow(try codec(keyA, place: .redis(key: "tokenrelay:a")).decode(redisA, name: "x"))
    }

    func testANamedIdentitysFileIsBoundToItAndTheUnboundFormStillOpens() throws {
        let sealedForA = try codec(keyA, place: .identityTokenFile(name: "a")).encode(tokens)
        for place in [TokenStatePlace.identityTokenFile(name: "b"), .tokenFile] {
            XCTAssertThrowsError(try codec(keyA, place: place).decode(sealedForA, name: "b.json")) { error in
                XCTAssertTrue("\(error)".contains("authentication tag does not match"), "\(error)")
            }
        }
        XCTAssertEqual(try codec(keyA, place: .identityTokenFile(name: "a")).decode(sealedForA, name: "a.json").refreshToken, tokens.refreshToken)
        // A file an identity's store sealed before the binding (as a plain token file) is still read.
        let unbound = try codec(keyA, place: .tokenFile).encode(tokens)
        XCTAssertEqual(try codec(keyA, place: .identityTokenFile(name: "a")).decode(unbound, name: "a.json").refreshToken, tokens.refreshToken)
        // The place comes from the scoped config.
        var identityTokens = Config.Tokens(file: "/x/a.json")
        identityTokens.identity = "a"
        XCTAssertEqual(try ConfiguredTokenCodecs(identityTokens).file.place, .identityTokenFile(name: "a"))
        XCTAssertEqual(try ConfiguredTokenCodecs(Config.Tokens(file: "/x/t.json")).file.place, .tokenFile)
    }

    func testAPreviousKeyOpensAndAsksForResealing() throws {
        let old = try codec(keyA).encode(tokens)
        let rotated = codec(keyB, previous: [keyA])
        let (opened, form) = try rotated.decodeWithForm(old, name: "t.json")
        XCTAssertEqual(opened.refreshToken, tokens.refreshToken)
        XCTAssertEqual(form, .sealed(keyID: keyA.id))
        XCTAssertTrue(rotated.needsResealing(form))
        XCTAssertEqual(try rotated.decodeWithForm(try rotated.encode(opened), name: "t.json").form, .sealed(keyID: keyB.id))
    }

    func testAPlainDocumentIsReadAndAsksForResealing() throws {
        let plain = try TokenStateCodec.plain.encode(tokens)
        XCTAssertTrue(String(decoding: plain, as: UTF8.self).contains("access-token-visible"), "no sealer: the public plain format")
        let (opened, form) = try codec(keyA).decodeWithForm(plain, name: "t.json")
        XCTAssertEqual(opened.accessToken, tokens.accessToken)
        XCTAssertEqual(form, .plain)
        XCTAssertTrue(codec(keyA).needsResealing(form))
        XCTAssertFalse(TokenStateCodec.plain.needsResealing(form))
    }

    func testRefusalsAreOneLineAndQuoteNothingSealed() throws {
        let sealed = try codec(keyA).encode(tokens)
        var object = try XCTUnwrap(JSONSerialization.jsonObject(with: sealed) as? [String: Any])
        let envelope = try XCTUnwrap(object["sealed"] as? [String: Any])
        let ciphertext = try XCTUnwrap(envelope["ciphertext"] as? String)

        func refusal(_ data: Data, _ codec: TokenStateCodec) -> String {
            do {
                _ = try codec.decode(data, name: "t.json")
                return "opened"
            } catch {
                return "\(error)"
            }
        }
        let unknown = refusal(sealed, codec(keyB))
        XCTAssertTrue(unknown.contains("key id \(keyA.id), which is not tokens.encryption.key_file (key id \(keyB.id))"), unknown)
        XCTAssertTrue(refusal(sealed, .plain).contains("tokens.encryption.key_file must name its key"))

        var flipped = Array(ciphertext)
        flipped[10] = flipped[10] == "A" ? "B" : "A"
        object["sealed"] = envelope.merging(["ciphertext": String(flipped)]) { $1 }
        let tampered = refusal(try JSONSerialization.data(withJSONObject: object), codec(keyA))
        XCTAssertTrue(tampered.contains("authentication tag does not match"), tampered)
        object["sealed"] = envelope.merging(["ciphertext": String(ciphertext.prefix(40))]) { $1 }
        XCTAssertTrue(refusal(try JSONSerialization.data(withJSONObject: object), codec(keyA)).contains("authentication tag does not match"))
        object["sealed"] = envelope.merging(["ciphertext": "AAAA"]) { $1 }
        XCTAssertTrue(refusal(try JSONSerialization.data(withJSONObject: object), codec(keyA)).contains("truncated"))
        object["sealed"] = envelope
        object["access_token"] = "smuggled-beside-the-envelope"
        XCTAssertTrue(refusal(try JSONSerialization.data(withJSONObject: object), codec(keyA)).contains("nothing beside it"))
        XCTAssertTrue(refusal(sealed.prefix(sealed.count - 20), codec(keyA)).contains("is not valid JSON"))

        for text in [unknown, tampered] {
            XCTAssertFalse(text.contains("\n"))
            XCTAssertFalse(text.contains(String(ciphertext.prefix(12))), "no sealed byte in an error")
            XCTAssertFalse(text.contains(envelope["nonce"] as! String))
        }
    }

    /// The refusals a token file store turns into "do not present, do not overwrite" (`StoreRead.sealedUnopened`).
    func testSealedRefusalsAreMarkedAndAPlainFilesErrorsAreNot() throws {
        let sealed = try codec(keyA).encode(tokens)
        for (data, reader) in [(sealed, codec(keyB)), (sealed, TokenStateCodec.plain)] {
            XCTAssertThrowsError(try reader.decode(data, name: "t.json")) { error in
                XCTAssertEqual((error as? TokenFileError)?.sealedStateRefused, true, "\(error)")
            }
        }
        XCTAssertThrowsError(try codec(keyA).decode(Data("{".utf8), name: "t.json")) { error in
            XCTAssertNotEqual((error as? TokenFileError)?.sealedStateRefused, true, "\(error)")
        }
    }

    func testKeyParsing() throws {
        let raw = [UInt8](repeating: 7, count: 32)
        XCTAssertEqual(try SealingKey.parse(raw, source: "k").bytes, raw)
        let base64 = Array((Data(raw).base64EncodedString() + "\n").utf8)
        XCTAssertEqual(try SealingKey.parse(base64, source: "k").bytes, raw)
        XCTAssertEqual(try SealingKey.parse(Array(("  " + Data(raw).base64EncodedString() + "\r\n").utf8), source: "k").bytes, raw)
        for bad in [[UInt8](), Array("c2hvcnQ=\n".utf8), [UInt8](repeating: 1, count: 31), [UInt8](repeating: 1, count: 33)] {
            XCTAssertThrowsError(try SealingKey.parse(bad, source: "/etc/key")) { error in
                XCTAssertTrue("\(error)".hasPrefix("/etc/key "), "\(error)")
                XCTAssertFalse("\(error)".contains("c2hvcnQ"))
            }
        }
    }

    func testConfigKeys() throws {
        func load(_ encryption: Any) throws -> TokenEncryptionSettings? {
            let json: [String: Any] = ["listen": "127.0.0.1:0", "upstream": ["url": "http://127.0.0.1:1"],
                                       "tokens": ["file": "/tmp/t.json", "encryption": encryption],
                                       "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:1/t", "client_id": "c", "client_auth": "none"]]
            return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: json)).tokens.encryption
        }
        XCTAssertEqual(try load(["key_file": "/k", "previous_key_files": ["/o1", "/o2"]]),
                       TokenEncryptionSettings(key: .file("/k"), previousKeyFiles: ["/o1", "/o2"]))
        XCTAssertEqual(try load(["key_env": "K"]), TokenEncryptionSettings(key: .environment("K")))
        XCTAssertThrowsError(try load(["key_file": "/k", "key_env": "K"])) { XCTAssertEqual("\($0)", "tokens.encryption.key_file: give either key_file or key_env, not both") }
        XCTAssertThrowsError(try load([String: Any]())) { XCTAssertEqual("\($0)", "tokens.encryption.key_file: is required (or tokens.encryption.key_env)") }
        XCTAssertThrowsError(try load(["key_fil": "/k"])) { XCTAssertTrue("\($0)".contains("key_fil"), "\($0)") }
        XCTAssertThrowsError(try load(["key_file": "/k", "previous_key_files": [""]])) {
            XCTAssertEqual("\($0)", "tokens.encryption.previous_key_files[0]: must be a non-empty string")
        }
    }
}
