import Foundation
import XCTest
import JOSE

/// Every algorithm signs what the `openssl` command line verifies, with keys openssl generated and with
/// keys this module generated; and a changed message does not verify (the check can fail).
final class SigningTests: XCTestCase {
    func testEveryAlgorithmSignsWhatOpenSSLVerifies() throws {
        let scratch = try Scratch()
        for alg in JWSAlgorithm.allCases {
            let key = try SigningKey.load(pemFile: try scratch.generateKey("key", for: alg))
            try key.check(alg)
            let message = Array("eyJhbGciOiJ\(alg.rawValue)In0.eyJzdWIiOiJ0b2tlbnJlbGF5In0".utf8)
            let signature = try key.sign(message, alg: alg)
            XCTAssertTrue(try scratch.opensslVerifies("key", alg: alg, message: message, signature: signature), "\(alg)")
            XCTAssertFalse(try scratch.opensslVerifies("key", alg: alg, message: message + [0x2E], signature: signature), "\(alg) tampered")
            let expectedCount = switch alg { case .ES256: 64; case .ES384: 96; case .EdDSA: 64; case .RS256, .PS256: 256 }
            XCTAssertEqual(signature.count, expectedCount, "\(alg)")
        }
    }

    func testGeneratedKeysSignAndExportAPKCS8PEMThatOpenSSLReads() throws {
        let scratch = try Scratch()
        for alg in JWSAlgorithm.allCases {
            let key = try SigningKey.generate(for: alg)
            XCTAssertEqual(key.defaultAlgorithm, alg == .PS256 ? .RS256 : alg)
            let pem = try key.privateKeyPEM()
            XCTAssertTrue(String(decoding: pem, as: UTF8.self).hasPrefix("-----BEGIN PRIVATE KEY-----\n"), "\(alg)")
            _ = try scratch.write("generated.pem", pem)
            try scratch.openssl(["pkey", "-in", scratch.path("generated.pem"), "-pubout", "-out", scratch.path("generated.pub")])
            let message = Array("generated \(alg)".utf8)
            XCTAssertTrue(try scratch.opensslVerifies("generated", alg: alg, message: message, signature: try key.sign(message, alg: alg)), "\(alg)")
            let reloaded = try SigningKey.load(pem: pem)
            XCTAssertEqual(reloaded.thumbprint, key.thumbprint, "\(alg)")
            XCTAssertEqual(reloaded.kind, key.kind, "\(alg)")
        }
        XCTAssertEqual(try SigningKey.generate(for: .RS256).kind, .rsa(bits: 2048))
        XCTAssertEqual(try SigningKey.generate(for: .ES384).kind, .ecP384)
    }

    /// r and s are fixed-width: a value with leading zero bytes is padded, never shortened. About one
    /// ES256 signature in 128 has one; 1500 signatures make missing them all about a 1-in-10^5 event.
    func testECDSASignaturesAreFixedWidthRAndSAcrossManySignatures() throws {
        let scratch = try Scratch()
        for (alg, width) in [(JWSAlgorithm.ES256, 32), (.ES384, 48)] {
            let key = try SigningKey.load(pemFile: try scratch.generateKey("ec", for: alg))
            var padded: [(message: [UInt8], signature: [UInt8])] = []
            for index in 0..<1500 {
                let message = Array("message \(index)".utf8)
                let signature = try key.sign(message, alg: alg)
                XCTAssertEqual(signature.count, 2 * width)
                if signature[0] == 0 || signature[width] == 0 { padded.append((message, signature)) }
            }
            if alg == .ES256 { XCTAssertGreaterThan(padded.count, 0, "no r or s with a leading zero among 1500 signatures") }
            for (message, signature) in padded.prefix(8) {
                XCTAssertTrue(try scratch.opensslVerifies("ec", alg: alg, message: message, signature: signature), "\(alg) padded")
            }
        }
    }

    func testOneKeySignsFromManyThreadsAtOnce() throws {
        // Ed25519 and RSASSA-PKCS1-v1_5 are deterministic: every thread must produce the same bytes.
        for alg in [JWSAlgorithm.EdDSA, .RS256] {
            let key = try SigningKey.generate(for: alg)
            let message = Array("shared".utf8)
            let expected = try key.sign(message, alg: alg)
            let results = Results(count: 64)
            DispatchQueue.concurrentPerform(iterations: 64) { index in
                results.set(index, try? key.sign(message, alg: alg))
            }
            XCTAssertEqual(results.all, Array(repeating: expected, count: 64), "\(alg)")
        }
    }

    func testAnEmptyMessageSigns() throws {
        // (openssl pkeyutl cannot verify an empty Ed25519 message: see the RFC 8032 test below.)
        let scratch = try Scratch()
        for alg in [JWSAlgorithm.ES256, .RS256] {
            let key = try SigningKey.load(pemFile: try scratch.generateKey("key", for: alg))
            XCTAssertTrue(try scratch.opensslVerifies("key", alg: alg, message: [], signature: try key.sign([], alg: alg)), "\(alg)")
        }
    }

    /// RFC 8032 §7.1 TEST 1: Ed25519 is deterministic, so the RFC's signature of the empty message is a
    /// known answer (the PKCS#8 wraps the RFC's secret key; the public key is the RFC's too).
    func testRFC8032Ed25519KnownAnswer() throws {
        let pem = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ1hsZ3v/VpguoRK9JLsLMREScVpezJpGXA7rAMcrn9g\n-----END PRIVATE KEY-----\n"
        let key = try SigningKey.load(pem: Array(pem.utf8))
        XCTAssertEqual(key.kind, .ed25519)
        XCTAssertEqual(key.publicJWK, #"{"crv":"Ed25519","kty":"OKP","x":"\#(Base64URL.encode(hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")))"}"#)
        XCTAssertEqual(try key.sign([], alg: .EdDSA), hex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"))
    }
}

private final class Results: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [[UInt8]?]
    init(count: Int) { values = Array(repeating: nil, count: count) }
    func set(_ index: Int, _ value: [UInt8]?) { lock.withLock { values[index] = value } }
    var all: [[UInt8]?] { lock.withLock { values } }
}

final class PreparedSignerTests: XCTestCase {
    /// The prepared context signs what openssl verifies, for every alg, many times over (each signature on
    /// its own copy: ECDSA signatures of one message differ, so no nonce is reused).
    func testPreparedSignaturesVerifyAndECDSANoncesDiffer() throws {
        let scratch = try Scratch()
        for alg in JWSAlgorithm.allCases {
            let key = try SigningKey.load(pemFile: try scratch.generateKey("prepared", for: alg))
            let signer = try PreparedSigner(key: key, alg: alg)
            let message = Array("eyJ0eXAiOiJkcG9wK2p3dCJ9.prepared-\(alg.rawValue)".utf8)
            var signatures = Set<[UInt8]>()
            for index in 0..<(alg == .ES384 || alg == .RS256 || alg == .PS256 ? 3 : 20) {
                let signature = try signer.sign(message)
                signatures.insert(signature)
                if index < 3 {
                    XCTAssertTrue(try scratch.opensslVerifies("prepared", alg: alg, message: message, signature: signature), "\(alg)")
                    XCTAssertFalse(try scratch.opensslVerifies("prepared", alg: alg, message: message + [0x2E], signature: signature), "\(alg) tampered")
                }
            }
            if alg == .ES256 { XCTAssertEqual(signatures.count, 20, "a fresh ECDSA nonce per signature") }
            if alg == .EdDSA || alg == .RS256 { XCTAssertEqual(signatures.count, 1, "deterministic") }
        }
        XCTAssertThrowsError(try PreparedSigner(key: try SigningKey.generate(for: .EdDSA), alg: .ES256))
    }
}
