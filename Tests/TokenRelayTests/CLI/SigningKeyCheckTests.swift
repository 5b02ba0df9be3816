import Foundation
import XCTest

/// A key that cannot sign is a `check` error naming its field, in one line, with no byte of the key.
final class SigningKeyCheckTests: XCTestCase {
    private var workDir: URL!

    override func setUpWithError() throws { workDir = makeTemporaryDirectory(prefix: "tokenrelay-keycheck") }
    override func tearDownWithError() throws { if let workDir { try? FileManager.default.removeItem(at: workDir) } }

    private func check(refresh: [String: Any]) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        var refreshObject: [String: Any] = ["grant": "client_credentials", "token_url": "http://127.0.0.1:9/token", "client_id": "c"]
        refreshObject.merge(refresh) { _, new in new }
        let config: [String: Any] = ["listen": "127.0.0.1:0", "upstream": ["url": "http://127.0.0.1:9"],
                                     "tokens": ["file": workDir.appendingPathComponent("tokens.json").path], "refresh": refreshObject]
        let url = workDir.appendingPathComponent("config-\(UUID().uuidString.prefix(6)).json")
        try JSONSerialization.data(withJSONObject: config).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path])
    }

    private func assertRefused(_ refresh: [String: Any], mentioning texts: [String], key: URL? = nil,
                               file: StaticString = #filePath, line: UInt = #line) throws {
        let result = try check(refresh: refresh)
        XCTAssertEqual(result.exitCode, 2, result.stderr, file: file, line: line)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, "one line: \(result.stderr)", file: file, line: line)
        for text in texts { XCTAssertTrue(result.stderr.contains(text), "expected \(text) in \(result.stderr)", file: file, line: line) }
        if let key {
            for body in try String(contentsOf: key, encoding: .utf8).split(separator: "\n") where !body.hasPrefix("-----") {
                XCTAssertFalse(result.stderr.contains(body.prefix(20)), "key bytes in the error", file: file, line: line)
            }
        }
    }

    private func keyJWT(_ key: URL, alg: String? = nil) -> [String: Any] {
        var refresh: [String: Any] = ["client_auth": "private_key_jwt", "client_key_file": key.path]
        if let alg { refresh["client_assertion_alg"] = alg }
        return refresh
    }

    func testGoodKeysPass() throws {
        for kind in [TestKeys.Kind.rsa2048, .p256, .p384, .ed25519] {
            let result = try check(refresh: keyJWT(try TestKeys.make(kind, in: workDir)))
            XCTAssertEqual(result.exitCode, 0, "\(kind): \(result.stderr)")
        }
        XCTAssertEqual(try check(refresh: keyJWT(try TestKeys.make(.rsa2048, in: workDir), alg: "PS256")).exitCode, 0)
    }

    func testKeysThatCannotSignNameTheirField() throws {
        let missing = workDir.appendingPathComponent("absent.pem")
        try assertRefused(keyJWT(missing), mentioning: ["refresh.client_key_file", "absent.pem"])

        let short = try TestKeys.make(.rsa1024, in: workDir)
        try assertRefused(keyJWT(short), mentioning: ["refresh.client_key_file"], key: short)

        let ec = try TestKeys.make(.p256, in: workDir)
        try assertRefused(keyJWT(ec, alg: "RS256"), mentioning: ["refresh.client_assertion_alg"], key: ec)
        try assertRefused(keyJWT(ec, alg: "ES384"), mentioning: ["refresh.client_assertion_alg"], key: ec)
        let ed = try TestKeys.make(.ed25519, in: workDir)
        try assertRefused(keyJWT(ed, alg: "PS256"), mentioning: ["refresh.client_assertion_alg"], key: ed)

        let encrypted = workDir.appendingPathComponent("encrypted.pem")
        let made = try runTool("openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256",
                                           "-pass", "pass:hunter2", "-out", encrypted.path])
        XCTAssertEqual(made.exitCode, 0, made.stderr)
        try assertRefused(keyJWT(encrypted), mentioning: ["refresh.client_key_file"], key: encrypted)

        let notAKey = workDir.appendingPathComponent("cert-not-key.pem")
        try Data("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".utf8).write(to: notAKey)
        try assertRefused(keyJWT(notAKey), mentioning: ["refresh.client_key_file"])

        try assertRefused(["grant": "jwt_bearer", "assertion": ["key_file": short.path, "issuer": "i", "subject": "s"]],
                          mentioning: ["refresh.assertion.key_file"], key: short)
    }

    /// A file read for every token request is not required at `check` (the kubelet may not have written it
    /// yet), but an unusable one is named in a warning.
    func testCheckWarnsAboutAnUnusableAssertionFile() throws {
        let file = workDir.appendingPathComponent("projected-token")
        let missing = try check(refresh: ["client_auth": "private_key_jwt", "client_assertion_file": file.path])
        XCTAssertEqual(missing.exitCode, 0, missing.stderr)
        XCTAssertTrue(missing.stdout.contains("; WARNING: refresh.client_assertion_file: cannot read \(file.path)"), missing.stdout)
        try Data("a.b.c".utf8).write(to: file)
        XCTAssertTrue(try check(refresh: ["grant": "jwt_bearer", "assertion": ["file": file.path]]).stdout
            .contains("WARNING: refresh.assertion.file: \(file.path) does not hold a JWT"))
        try Data("opaque".utf8).write(to: file)
        let opaque = try check(refresh: ["grant": "token_exchange", "subject_token_file": file.path,
                                         "subject_token_type": "urn:ietf:params:oauth:token-type:access_token"])
        XCTAssertEqual(opaque.exitCode, 0, opaque.stderr)
        XCTAssertFalse(opaque.stdout.contains("WARNING"), opaque.stdout)
        XCTAssertFalse(opaque.stdout.contains("opaque"), "the file's content is never shown")
    }
}
