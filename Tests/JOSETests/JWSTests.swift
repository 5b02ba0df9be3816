import XCTest
import JOSE

final class JWSTests: XCTestCase {
    func testCompactSerialisationVerifiesWithOpenSSLAndReadsBack() throws {
        let scratch = try Scratch()
        let key = try SigningKey.load(pemFile: try scratch.generateKey("key", for: .ES256))
        let header = Array(#"{"alg":"ES256","typ":"JWT"}"#.utf8), payload = Array(#"{"iss":"client","exp":1900000000}"#.utf8)
        let token = try JWS.compact(headerJSON: header, payloadJSON: payload, key: key, alg: .ES256)
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        XCTAssertEqual(parts.count, 3)
        XCTAssertEqual(Base64URL.decode(parts[0]), header)
        XCTAssertEqual(Base64URL.decode(parts[1]), payload)
        let signature = try XCTUnwrap(Base64URL.decode(parts[2]))
        XCTAssertTrue(try scratch.opensslVerifies("key", alg: .ES256, message: Array("\(parts[0]).\(parts[1])".utf8), signature: signature))
        XCTAssertEqual(JWS.unverifiedPayload(Substring(token)), payload)
        XCTAssertThrowsError(try JWS.compact(headerJSON: header, payloadJSON: payload, key: key, alg: .RS256))
    }

    func testUnverifiedPayloadNeedsThreeBase64URLParts() {
        XCTAssertEqual(JWS.unverifiedPayload("eyJhIjoxfQ.eyJiIjoyfQ.c2ln"), Array(#"{"b":2}"#.utf8))
        XCTAssertEqual(JWS.unverifiedPayload("eyJhIjoxfQ.eyJiIjoyfQ."), Array(#"{"b":2}"#.utf8))   // unsigned (alg none)
        for bad in ["", "abc", "eyJhIjoxfQ.eyJiIjoyfQ", "a.b.c.d", "eyJhIjoxfQ..c2ln", ".eyJiIjoyfQ.c2ln", "eyJhIjoxfQ.ey J.c2ln",
                    "eyJhIjoxfQ.eyJiIjoyfQ==.c2ln", "eyJhIjoxfQ.eyJiIjoyfQ.c2ln\n"] {
            XCTAssertNil(JWS.unverifiedPayload(Substring(bad)), bad)
        }
    }

    func testDigestAndRandomness() {
        XCTAssertEqual(Digest.sha256(Array("abc".utf8)), hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"))
        XCTAssertEqual(Digest.sha256([]), hex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"))
        XCTAssertEqual(SecureRandom.bytes(0), [])
        XCTAssertEqual(SecureRandom.bytes(33).count, 33)
        let identifiers = Set((0..<1000).map { _ in SecureRandom.identifier() })
        XCTAssertEqual(identifiers.count, 1000)
        XCTAssertTrue(identifiers.allSatisfy { $0.count == 22 && Base64URL.decode(Substring($0))?.count == 16 })
    }
}
