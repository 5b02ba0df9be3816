import Foundation
import XCTest
import JOSE

/// Keys that cannot be used are refused with one line that names the cause and never the key.
final class KeyLoadingTests: XCTestCase {
    private func refusal(_ load: () throws -> SigningKey, file: StaticString = #filePath, line: UInt = #line) -> String {
        do {
            _ = try load()
            XCTFail("loaded", file: file, line: line)
            return ""
        } catch let error as JOSEError {
            XCTAssertFalse(error.description.contains("\n"), "one line: \(error)", file: file, line: line)
            return error.description
        } catch {
            XCTFail("\(error)", file: file, line: line)
            return ""
        }
    }

    /// No 12-character run of the PEM's base64 body appears in `message`.
    private func assertNoKeyBytes(_ message: String, pem: [UInt8], file: StaticString = #filePath, line: UInt = #line) {
        let body = String(decoding: pem, as: UTF8.self).split(separator: "\n").filter { !$0.hasPrefix("-----") && !$0.contains(":") }.joined()
        let characters = Array(body)
        var index = 0
        while index + 12 <= characters.count {
            XCTAssertFalse(message.contains(String(characters[index..<index + 12])), "key bytes in \(message)", file: file, line: line)
            index += 6
        }
    }

    func testAMissingFileIsNamedWithTheSystemsReason() {
        let message = refusal { try SigningKey.load(pemFile: "/nonexistent/jose/key.pem") }
        XCTAssertEqual(message, "cannot read /nonexistent/jose/key.pem: No such file or directory")
    }

    func testGarbageAndEmptyAndPublicKeysAreNotPrivateKeys() throws {
        let scratch = try Scratch()
        XCTAssertTrue(refusal { try SigningKey.load(pem: Array("hello, not a key".utf8)) }.hasPrefix("no PEM private key found"))
        XCTAssertEqual(refusal { try SigningKey.load(pem: []) }, "the file is empty")
        let path = try scratch.generateKey("key", for: .ES256)
        let publicPEM = try scratch.read("key.pub")
        XCTAssertTrue(refusal { try SigningKey.load(pem: publicPEM) }.hasPrefix("no PEM private key found"))
        var truncated = try scratch.read("key.pem")
        truncated.removeLast(40)
        let message = refusal { try SigningKey.load(pem: truncated) }
        XCTAssertTrue(message.hasPrefix("no PEM private key found"), message)
        assertNoKeyBytes(message, pem: try Array(Data(contentsOf: URL(fileURLWithPath: path))))
    }

    func testEncryptedKeysAreRefusedAsEncrypted() throws {
        let scratch = try Scratch()
        _ = try scratch.generateKey("plain", for: .ES256)
        // PKCS#8 "ENCRYPTED PRIVATE KEY" and a traditional "EC PRIVATE KEY" with Proc-Type: 4,ENCRYPTED.
        try scratch.openssl(["pkey", "-in", scratch.path("plain.pem"), "-aes256", "-passout", "pass:secret", "-out", scratch.path("pkcs8.pem")])
        try scratch.openssl(["ec", "-in", scratch.path("plain.pem"), "-aes256", "-passout", "pass:secret", "-out", scratch.path("traditional.pem")])
        _ = try scratch.generateKey("rsa", for: .RS256)
        try scratch.openssl(["pkey", "-in", scratch.path("rsa.pem"), "-traditional", "-aes256", "-passout", "pass:secret", "-out", scratch.path("rsa-traditional.pem")])
        for name in ["pkcs8.pem", "traditional.pem", "rsa-traditional.pem"] {
            let pem = try scratch.read(name)
            XCTAssertTrue(String(decoding: pem, as: UTF8.self).contains("ENCRYPTED"), name)
            let message = refusal { try SigningKey.load(pemFile: scratch.path(name)) }
            XCTAssertTrue(message.hasPrefix("the key is encrypted"), "\(name): \(message)")
            assertNoKeyBytes(message, pem: pem)
        }
    }

    func testTraditionalRSAAndECKeysLoad() throws {
        let scratch = try Scratch()
        _ = try scratch.generateKey("rsa", for: .RS256)
        _ = try scratch.generateKey("ec", for: .ES384)
        try scratch.openssl(["pkey", "-in", scratch.path("rsa.pem"), "-traditional", "-out", scratch.path("rsa-traditional.pem")])
        try scratch.openssl(["ec", "-in", scratch.path("ec.pem"), "-out", scratch.path("ec-traditional.pem")])
        XCTAssertTrue(String(decoding: try scratch.read("rsa-traditional.pem"), as: UTF8.self).hasPrefix("-----BEGIN RSA PRIVATE KEY-----"))
        XCTAssertTrue(String(decoding: try scratch.read("ec-traditional.pem"), as: UTF8.self).hasPrefix("-----BEGIN EC PRIVATE KEY-----"))
        XCTAssertEqual(try SigningKey.load(pemFile: scratch.path("rsa-traditional.pem")).kind, .rsa(bits: 2048))
        XCTAssertEqual(try SigningKey.load(pemFile: scratch.path("ec-traditional.pem")).kind, .ecP384)
        XCTAssertEqual(try SigningKey.load(pemFile: scratch.path("rsa-traditional.pem")).thumbprint,
                       try SigningKey.load(pemFile: scratch.path("rsa.pem")).thumbprint)
    }

    func testAKeyAfterACertificateInOneFileLoads() throws {
        let scratch = try Scratch()
        try scratch.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=jose",
                             "-keyout", scratch.path("key.pem"), "-out", scratch.path("cert.pem")])
        let combined = try scratch.read("cert.pem") + scratch.read("key.pem")
        XCTAssertEqual(try SigningKey.load(pem: combined).thumbprint, try SigningKey.load(pemFile: scratch.path("key.pem")).thumbprint)
        XCTAssertTrue(refusal { try SigningKey.load(pem: try scratch.read("cert.pem")) }.hasPrefix("no PEM private key found"))
    }

    func testUnsupportedKeyTypesAreRefused() throws {
        let scratch = try Scratch()
        try scratch.openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-521", "-out", scratch.path("p521.pem")])
        try scratch.openssl(["genpkey", "-algorithm", "X25519", "-out", scratch.path("x25519.pem")])
        for name in ["p521.pem", "x25519.pem"] {
            XCTAssertTrue(refusal { try SigningKey.load(pemFile: scratch.path(name)) }.hasPrefix("unsupported key type"), name)
        }
    }

    func testAShortRSAKeyLoadsButCannotSign() throws {
        let scratch = try Scratch()
        try scratch.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", scratch.path("short.pem")])
        let key = try SigningKey.load(pemFile: scratch.path("short.pem"))
        XCTAssertEqual(key.kind, .rsa(bits: 1024))
        for alg in [JWSAlgorithm.RS256, .PS256] {
            XCTAssertThrowsError(try key.check(alg)) {
                XCTAssertEqual("\($0)", "\(alg.rawValue) needs an RSA key of at least 2048 bits, not an RSA 1024-bit key")
            }
            XCTAssertThrowsError(try key.sign([1, 2, 3], alg: alg))
        }
    }

    func testAKeyOfTheWrongTypeForItsAlgorithmCannotSign() throws {
        let ec = try SigningKey.generate(for: .ES256)
        XCTAssertThrowsError(try ec.check(.RS256)) { XCTAssertEqual("\($0)", "RS256 needs an RSA key of at least 2048 bits, not an EC P-256 key") }
        XCTAssertThrowsError(try ec.check(.ES384)) { XCTAssertEqual("\($0)", "ES384 needs an EC P-384 key, not an EC P-256 key") }
        XCTAssertThrowsError(try ec.check(.EdDSA)) { XCTAssertEqual("\($0)", "EdDSA needs an Ed25519 key, not an EC P-256 key") }
        XCTAssertThrowsError(try ec.sign([1], alg: .RS256))
        let ed = try SigningKey.generate(for: .EdDSA)
        XCTAssertThrowsError(try ed.check(.ES256)) { XCTAssertEqual("\($0)", "ES256 needs an EC P-256 key, not an Ed25519 key") }
        XCTAssertNoThrow(try ed.check(.EdDSA))
        let rsa = try SigningKey.generate(for: .PS256)
        XCTAssertNoThrow(try rsa.check(.PS256))
        XCTAssertNoThrow(try rsa.check(.RS256))
        XCTAssertThrowsError(try rsa.check(.ES256)) { XCTAssertEqual("\($0)", "ES256 needs an EC P-256 key, not an RSA 2048-bit key") }
    }
}
