import XCTest
import JOSE

final class AESGCMTests: XCTestCase {
    private let key = Array(0..<32 as Range<UInt8>)
    private let nonce = Array(100..<112 as Range<UInt8>)
    private let aad = Array("file:tokens.json".utf8)

    func testRoundTrip() throws {
        for count in [0, 1, 15, 16, 17, 1000] {
            let plaintext = SecureRandom.bytes(count)
            let sealed = try AESGCM.seal(key: key, nonce: nonce, plaintext: plaintext, associatedData: aad)
            XCTAssertEqual(sealed.ciphertext.count, count)
            XCTAssertEqual(sealed.tag.count, 16)
            if count > 16 { XCTAssertNotEqual(sealed.ciphertext, plaintext) }
            XCTAssertEqual(try AESGCM.open(key: key, nonce: nonce, ciphertext: sealed.ciphertext, tag: sealed.tag, associatedData: aad), plaintext)
        }
        let noAAD = try AESGCM.seal(key: key, nonce: nonce, plaintext: [7], associatedData: [])
        XCTAssertEqual(try AESGCM.open(key: key, nonce: nonce, ciphertext: noAAD.ciphertext, tag: noAAD.tag, associatedData: []), [7])
    }

    /// Generated with python3's `cryptography` (AESGCM(key).encrypt(nonce, plaintext, aad)).
    func testKnownAnswer() throws {
        let plaintext = hex("746f6b656e72656c6179207365616c656420746f6b656e2073746174652000ff")
        let sealed = try AESGCM.seal(key: key, nonce: nonce, plaintext: plaintext, associatedData: aad)
        XCTAssertEqual(sealed.ciphertext, hex("3c74b503179b33f25f1b7f9bbf04069826e27265e0099d52d4a5cd3c9e83a5b7"))
        XCTAssertEqual(sealed.tag, hex("1ce7808be8287cdef8e461040b636b18"))
    }

    /// The GCM specification's test cases 13 and 14 (256-bit zero key, zero IV).
    func testGCMSpecificationVectors() throws {
        let zeroKey = [UInt8](repeating: 0, count: 32), zeroNonce = [UInt8](repeating: 0, count: 12)
        let empty = try AESGCM.seal(key: zeroKey, nonce: zeroNonce, plaintext: [], associatedData: [])
        XCTAssertEqual(empty.ciphertext, [])
        XCTAssertEqual(empty.tag, hex("530f8afbc74536b9a963b4f1c4cb738b"))
        let block = try AESGCM.seal(key: zeroKey, nonce: zeroNonce, plaintext: [UInt8](repeating: 0, count: 16), associatedData: [])
        XCTAssertEqual(block.ciphertext, hex("cea7403d4d606b6e074ec5d3baf39d18"))
        XCTAssertEqual(block.tag, hex("d0d1c8a799996bf0265b98b5d48ab919"))
    }

    func testTamperingWrongAADAndWrongKeyFailTheTag() throws {
        let plaintext = Array("refresh-token-value".utf8)
        let sealed = try AESGCM.seal(key: key, nonce: nonce, plaintext: plaintext, associatedData: aad)
        func refused(key: [UInt8]? = nil, nonce: [UInt8]? = nil, ciphertext: [UInt8]? = nil, tag: [UInt8]? = nil, aad: [UInt8]? = nil) {
            XCTAssertThrowsError(try AESGCM.open(key: key ?? self.key, nonce: nonce ?? self.nonce, ciphertext: ciphertext ?? sealed.ciphertext,
                                                 tag: tag ?? sealed.tag, associatedData: aad ?? self.aad)) {
                XCTAssertEqual("\($0)", "authentication tag does not match")
            }
        }
        var tag = sealed.tag
        tag[15] ^= 1
        refused(tag: tag)
        var ciphertext = sealed.ciphertext
        ciphertext[0] ^= 0x80
        refused(ciphertext: ciphertext)
        refused(ciphertext: Array(sealed.ciphertext.dropLast()))
        refused(aad: Array("redis:tokenrelay:other".utf8))
        refused(aad: [])
        var otherKey = key
        otherKey[31] ^= 1
        refused(key: otherKey)
        var otherNonce = nonce
        otherNonce[0] ^= 1
        refused(nonce: otherNonce)
    }

    func testWrongSizesAreRefused() {
        XCTAssertThrowsError(try AESGCM.seal(key: Array(key.dropLast()), nonce: nonce, plaintext: [1], associatedData: [])) {
            XCTAssertEqual("\($0)", "an AES-256-GCM key has 32 bytes, not 31")
        }
        XCTAssertThrowsError(try AESGCM.seal(key: key, nonce: [1, 2, 3], plaintext: [1], associatedData: [])) {
            XCTAssertEqual("\($0)", "an AES-256-GCM nonce has 12 bytes, not 3")
        }
        XCTAssertThrowsError(try AESGCM.open(key: key, nonce: nonce, ciphertext: [1], tag: [1], associatedData: [])) {
            XCTAssertEqual("\($0)", "an AES-256-GCM tag has 16 bytes, not 1")
        }
    }
}
