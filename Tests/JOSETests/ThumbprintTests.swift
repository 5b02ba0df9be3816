import XCTest
@testable import JOSE

/// RFC 7638 thumbprints: the RFC's own example, and EC/OKP keys recomputed by python3 from the DER
/// public key openssl writes (python parses the SubjectPublicKeyInfo itself).
final class ThumbprintTests: XCTestCase {
    func testTheRFC7638ExampleKey() {
        let n = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"
        XCTAssertEqual(JWK.thumbprint(JWK.rsa(n: n, e: "AQAB")), "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs")
    }

    private let python = #"""
import base64, hashlib, json, sys
der = open(sys.argv[1], "rb").read()
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
kind = sys.argv[2]
if kind == "OKP":
    jwk = {"crv": "Ed25519", "kty": "OKP", "x": b64(der[-32:])}
else:
    width = 32 if kind == "P-256" else 48
    point = der[-(2 * width + 1):]
    assert point[0] == 4
    jwk = {"crv": kind, "kty": "EC", "x": b64(point[1:1 + width]), "y": b64(point[1 + width:])}
canonical = json.dumps(jwk, sort_keys=True, separators=(",", ":"))
print(canonical)
print(b64(hashlib.sha256(canonical.encode()).digest()))
"""#

    func testECAndOKPThumbprintsMatchPython() throws {
        let scratch = try Scratch()
        _ = try scratch.write("thumbprint.py", Array(python.utf8))
        for (alg, kind) in [(JWSAlgorithm.ES256, "P-256"), (.ES384, "P-384"), (.EdDSA, "OKP")] {
            for round in 0..<6 {   // several keys: some have a coordinate with leading zero bytes
                let key = try SigningKey.load(pemFile: try scratch.generateKey("key\(round)", for: alg))
                try scratch.openssl(["pkey", "-pubin", "-in", scratch.path("key\(round).pub"), "-outform", "DER", "-out", scratch.path("key.der")])
                let result = try scratch.run("python3", [scratch.path("thumbprint.py"), scratch.path("key.der"), kind])
                XCTAssertEqual(result.status, 0, result.output)
                let lines = result.output.split(separator: "\n").map(String.init)
                XCTAssertEqual(lines, [key.publicJWK, key.thumbprint], "\(alg)")
            }
        }
    }

    func testRSAPublicJWKMatchesOpenSSLsModulus() throws {
        let scratch = try Scratch()
        let key = try SigningKey.load(pemFile: try scratch.generateKey("rsa", for: .RS256))
        let result = try scratch.run("openssl", ["rsa", "-pubin", "-in", scratch.path("rsa.pub"), "-noout", "-modulus"])
        let modulus = hex(String(result.output.trimmingCharacters(in: .whitespacesAndNewlines).dropFirst("Modulus=".count)))
        XCTAssertEqual(key.publicJWK, JWK.rsa(n: Base64URL.encode(modulus), e: "AQAB"))
        XCTAssertEqual(key.thumbprint.count, 43)
        XCTAssertFalse(key.publicJWK.contains(" "))
    }
}
