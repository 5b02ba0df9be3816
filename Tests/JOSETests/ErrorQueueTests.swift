import XCTest
@testable import JOSE

/// Every failure leaves OpenSSL's per-thread error queue empty (the event loop's TLS reads that queue).
final class ErrorQueueTests: XCTestCase {
    func testFailuresLeaveNoOpenSSLErrorBehind() throws {
        let scratch = try Scratch()
        _ = try scratch.generateKey("plain", for: .ES256)
        try scratch.openssl(["pkey", "-in", scratch.path("plain.pem"), "-aes256", "-passout", "pass:secret", "-out", scratch.path("encrypted.pem")])
        try scratch.openssl(["genpkey", "-algorithm", "X25519", "-out", scratch.path("x25519.pem")])
        XCTAssertTrue(OpenSSLErrorQueue.isEmpty)
        for path in ["encrypted.pem", "x25519.pem", "plain.pub"] {
            XCTAssertThrowsError(try SigningKey.load(pemFile: scratch.path(path)))
            XCTAssertTrue(OpenSSLErrorQueue.isEmpty, path)
        }
        XCTAssertThrowsError(try SigningKey.load(pem: Array("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".utf8)))
        XCTAssertTrue(OpenSSLErrorQueue.isEmpty)
        let key = Array(repeating: UInt8(1), count: 32), nonce = Array(repeating: UInt8(2), count: 12)
        let sealed = try AESGCM.seal(key: key, nonce: nonce, plaintext: [1, 2, 3], associatedData: [])
        XCTAssertThrowsError(try AESGCM.open(key: key, nonce: nonce, ciphertext: sealed.ciphertext, tag: Array(repeating: 0, count: 16), associatedData: []))
        XCTAssertTrue(OpenSSLErrorQueue.isEmpty)
    }

    func testSuccessesLeaveNoOpenSSLErrorBehind() throws {
        let scratch = try Scratch()
        for alg in JWSAlgorithm.allCases {
            _ = try scratch.generateKey("key", for: alg)
            // Ed25519 has no traditional form.
            if alg != .EdDSA { try scratch.openssl(["pkey", "-in", scratch.path("key.pem"), "-traditional", "-out", scratch.path("traditional.pem")]) }
            for name in alg == .EdDSA ? ["key.pem"] : ["key.pem", "traditional.pem"] {
                let key = try SigningKey.load(pemFile: scratch.path(name))
                XCTAssertTrue(OpenSSLErrorQueue.isEmpty, "\(alg) \(name) load")
                _ = try key.sign([1, 2, 3], alg: alg)
                _ = try key.privateKeyPEM()
                XCTAssertTrue(OpenSSLErrorQueue.isEmpty, "\(alg) \(name) sign")
            }
            _ = try SigningKey.generate(for: alg)
            XCTAssertTrue(OpenSSLErrorQueue.isEmpty, "\(alg) generate")
        }
    }

    func testADescriptionNamesOnlyTheKindAndThumbprint() throws {
        let key = try SigningKey.generate(for: .ES256)
        XCTAssertEqual(key.description, "an EC P-256 key (jkt \(key.thumbprint))")
    }
}
