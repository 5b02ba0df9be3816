import Foundation
import TLSFixtures
import XCTest

/// `tokenrelay check`: exit 0 on a good setup, otherwise one line that names the problem.
final class CheckCommandTests: RelayTestCase {
    private func check(_ config: [String: Any], environment: [String: String] = ["TOKENRELAY_CLIENT_SECRET": RelayTestCase.clientSecret])
        throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("check-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path], environment: environment)
    }

    private func assertFails(_ result: (exitCode: Int32, stdout: String, stderr: String), mentioning text: String,
                             file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertNotEqual(result.exitCode, 0, file: file, line: line)
        let lines = result.stderr.split(separator: "\n")
        XCTAssertEqual(lines.count, 1, "one line: \(result.stderr)", file: file, line: line)
        XCTAssertTrue(result.stderr.contains(text), "expected \(text) in \(result.stderr)", file: file, line: line)
    }

    func testValidConfig() throws {
        let result = try check(config())
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.hasPrefix("ok:"), result.stdout)
    }

    func testMissingTokenFile() throws {
        assertFails(try check(config(["tokens": ["file": workDir.appendingPathComponent("absent.json").path]])), mentioning: "absent.json")
    }

    func testUnsetSecretVariable() throws {
        assertFails(try check(config(), environment: [:]), mentioning: "TOKENRELAY_CLIENT_SECRET is not set")
    }

    func testMalformedJSON() throws {
        let url = workDir.appendingPathComponent("malformed.json")
        try Data("{ \"listen\": \"127.0.0.1:8080\", ".utf8).write(to: url)
        assertFails(try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path]), mentioning: "not valid JSON")
    }

    func testEmptySecretVariableIsNotReportedAsUnset() throws {
        assertFails(try check(config(), environment: ["TOKENRELAY_CLIENT_SECRET": ""]), mentioning: "TOKENRELAY_CLIENT_SECRET is empty")
    }

    func testEmptySecretFile() throws {
        let secretFile = workDir.appendingPathComponent("empty_secret")
        try Data("\n".utf8).write(to: secretFile)
        let result = try check(config(["refresh": ["client_secret_env": NSNull(), "client_secret_file": secretFile.path]]))
        assertFails(result, mentioning: "refresh.client_secret_file: \(secretFile.path) is empty")
    }

    /// Checked on the file's text: Foundation's parser on Linux accepts a trailing comma and keeps the
    /// last of two equal keys.
    private func checkText(_ text: String) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("check-\(UUID().uuidString).json")
        try Data(text.utf8).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path],
                                                environment: ["TOKENRELAY_CLIENT_SECRET": RelayTestCase.clientSecret])
    }

    private func configText() throws -> String {
        let text = String(decoding: try JSONSerialization.data(withJSONObject: config(), options: [.prettyPrinted, .sortedKeys]), as: UTF8.self)
        XCTAssertEqual(try checkText(text).exitCode, 0, "the unmodified text passes")
        return text
    }

    func testTrailingCommaIsRefused() throws {
        let text = try configText()
        let closing = try XCTUnwrap(text.range(of: "}", options: .backwards))
        let withComma = text[..<closing.lowerBound].trimmingCharacters(in: .whitespacesAndNewlines) + ",\n}\n"
        let commaLine = withComma.split(separator: "\n", omittingEmptySubsequences: false).count - 2
        assertFails(try checkText(withComma), mentioning: "is not valid JSON: trailing comma at line \(commaLine)")
        assertFails(try checkText(text.replacingOccurrences(of: "\"token_url\"", with: "\"trigger_statuses\": [401, 403, ],\n\"token_url\"")),
                    mentioning: "trailing comma")
    }

    func testDuplicateKeyIsRefusedWithItsPath() throws {
        let text = try configText()
        assertFails(try checkText(text.replacingOccurrences(of: "{\n", with: "{\n\"listen\": \"127.0.0.1:9\",\n", options: .anchored)),
                    mentioning: "listen: duplicate key at line")
        let nested = text.replacingOccurrences(of: "\"client_id\"", with: "\"client_id\": \"other-app\",\n\"client_id\"")
        assertFails(try checkText(nested), mentioning: "refresh.client_id: duplicate key at line")
        let escaped = text.replacingOccurrences(of: "\"client_id\"", with: "\"client_\\u0069d\": \"other-app\",\n\"client_id\"")
        assertFails(try checkText(escaped), mentioning: "refresh.client_id: duplicate key at line")
    }

    func testAdminListenMustDifferFromListen() throws {
        assertFails(try check(config(["listen": "127.0.0.1:18080", "admin": ["listen": "127.0.0.1:18080"]])),
                    mentioning: "admin.listen: must differ from listen")
        assertFails(try check(config(["listen": "0.0.0.0:18080", "admin": ["listen": "127.0.0.1:18080"]])),
                    mentioning: "admin.listen: must differ from listen")
        XCTAssertEqual(try check(config(["listen": "127.0.0.1:18080", "admin": ["listen": "127.0.0.1:18081"]])).exitCode, 0)
        XCTAssertEqual(try check(config(["listen": "127.0.0.1:0", "admin": ["listen": "127.0.0.1:0"]])).exitCode, 0, "port 0 picks two ports")
    }

    func testUnknownKey() throws {
        assertFails(try check(config(["refresh": ["clinet_id": "typo"]])), mentioning: "refresh.clinet_id: unknown key (did you mean client_id?)")
        // The typo in place of the key: named as the typo, not as a missing client_id.
        var replaced = config()
        var refresh = replaced["refresh"] as! [String: Any]
        refresh["clinet_id"] = refresh.removeValue(forKey: "client_id")
        replaced["refresh"] = refresh
        assertFails(try check(replaced), mentioning: "refresh.clinet_id: unknown key (did you mean client_id?)")
    }

    func testMissingConfigFile() throws {
        assertFails(try TokenRelayProcess.runCommand(arguments: ["check", "--config", "/nonexistent/tokenrelay.json"]),
                    mentioning: "/nonexistent/tokenrelay.json")
    }

    /// Every example under config/ passes `check` once its file paths point at this test's files
    /// (TLS files at a PKI generated for the test run).
    func testEveryExampleConfigPassesCheck() throws {
        let configDirectory = repositoryRoot.appendingPathComponent("config")
        let examples = try FileManager.default.contentsOfDirectory(atPath: configDirectory.path)
            .filter { $0.hasSuffix(".json") && !$0.contains("schema") }
        XCTAssertFalse(examples.isEmpty)
        let secretFile = workDir.appendingPathComponent("client_secret")
        try Data("example-secret\n".utf8).write(to: secretFile)
        for name in examples {
            let data = try Data(contentsOf: configDirectory.appendingPathComponent(name))
            var object = try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any], name)
            // The top level's tokens and refresh, and each identity's (a config may have only identities).
            func pointAtTestFiles(_ owner: inout [String: Any], tokenFile: URL) throws {
                if var tokens = owner["tokens"] as? [String: Any], tokens["redis"] == nil || tokens["file"] != nil {
                    tokens["file"] = tokenFile.path
                    owner["tokens"] = tokens
                }
                guard var refresh = owner["refresh"] as? [String: Any] else { return }
                if refresh["client_secret_file"] != nil { refresh["client_secret_file"] = secretFile.path }
                // Key files name a deployment's path (a systemd credential, a Secret volume): a key made here stands in.
                if refresh["client_key_file"] != nil { refresh["client_key_file"] = try exampleSigningKey().path }
                if var assertion = refresh["assertion"] as? [String: Any], assertion["key_file"] != nil {
                    assertion["key_file"] = try exampleSigningKey().path
                    refresh["assertion"] = assertion
                }
                owner["refresh"] = refresh
            }
            try pointAtTestFiles(&object, tokenFile: tokenFileURL)
            if var identities = object["identities"] as? [String: [String: Any]] {
                for identity in identities.keys {
                    try pointAtTestFiles(&identities[identity]!, tokenFile: workDir.appendingPathComponent("\(identity)-tokens.json"))
                }
                object["identities"] = identities
            }
            for target in ["upstream", "refresh"] {
                guard var section = object[target] as? [String: Any], let tls = section["tls"] as? [String: Any] else { continue }
                section["tls"] = try pointingAtTestPKI(tls)
                object[target] = section
            }
            let result = try check(object, environment: ["TOKENRELAY_CLIENT_SECRET": RelayTestCase.clientSecret,
                                                         "TOKENRELAY_REDIS_PASSWORD": "example-redis-password"])
            XCTAssertEqual(result.exitCode, 0, "\(name): \(result.stderr)")
        }
    }

    /// An EC P-256 private key in PEM, made once per test with the openssl command line.
    private func exampleSigningKey() throws -> URL {
        let keyFile = workDir.appendingPathComponent("example-signing-key.pem")
        if FileManager.default.fileExists(atPath: keyFile.path) { return keyFile }
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        openssl.arguments = ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyFile.path]
        try openssl.run()
        openssl.waitUntilExit()
        XCTAssertEqual(openssl.terminationStatus, 0, "openssl genpkey")
        return keyFile
    }

    private func pointingAtTestPKI(_ tls: [String: Any]) throws -> [String: Any] {
        let pki = try TestPKI.shared()
        var tls = tls
        if tls["ca_file"] != nil { tls["ca_file"] = pki.caFile.path }
        if tls["client_cert"] != nil { tls["client_cert"] = pki.client.cert.path }
        if tls["client_key"] != nil { tls["client_key"] = pki.client.key.path }
        return tls
    }
}
