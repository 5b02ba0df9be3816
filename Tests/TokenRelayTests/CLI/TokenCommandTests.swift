import Foundation
import XCTest

/// `tokenrelay token show` and `token import`: the token file inspected and written without a token ever
/// on the command line or in the output.
final class TokenCommandTests: RelayTestCase {
    private func writeConfig(_ overrides: [String: Any] = [:]) throws -> URL {
        let url = workDir.appendingPathComponent("config-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config(overrides)).write(to: url)
        return url
    }

    private func run(_ arguments: [String], stdin: Data? = nil) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        try TokenRelayProcess.runCommand(arguments: arguments, stdin: stdin)
    }

    func testShowReportsStateWithoutRevealingTokens() throws {
        let access = tokenServer.currentAccessToken!, refresh = tokenServer.currentRefreshToken!
        try writeTokenFile(at: tokenFileURL, access: access, refresh: refresh, expiresAt: Date(timeIntervalSinceNow: 3600))
        let result = try run(["token", "show", "--config", writeConfig().path])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("mode: 0600"), result.stdout)
        XCTAssertTrue(result.stdout.contains("owner: "), result.stdout)
        XCTAssertTrue(result.stdout.contains("refresh token: present"), result.stdout)
        XCTAssertTrue(result.stdout.contains("(in 59m") || result.stdout.contains("(in 1h"), result.stdout)
        XCTAssertTrue(result.stdout.contains("access token: sha256:\(try sha256Prefix(access))"), result.stdout)
        XCTAssertFalse(result.stdout.contains(access) || result.stdout.contains(refresh), "no token in the output")
    }

    func testShowWithAnExpiredTokenAndNoRefreshToken() throws {
        try JSONSerialization.data(withJSONObject: ["access_token": "only-access", "expires_at": "2020-01-01T00:00:00Z"]).write(to: tokenFileURL)
        XCTAssertEqual(chmod(tokenFileURL.path, 0o644), 0)
        let result = try run(["token", "show", "--config", writeConfig().path])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("expired"), result.stdout)
        XCTAssertTrue(result.stdout.contains("refresh token: absent"), result.stdout)
        XCTAssertTrue(result.stdout.contains("mode: 0644 (too open"), result.stdout)
    }

    func testImportFromStdinWritesAPrivateFile() throws {
        try FileManager.default.removeItem(at: tokenFileURL)
        let input = Data(#"{"access_token":"imported-access-1","refresh_token":"imported-refresh-1","expires_in":600,"token_type":"Bearer"}"#.utf8)
        let result = try run(["token", "import", "--config", writeConfig().path], stdin: input)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertFalse(result.stdout.contains("imported-access-1") || result.stdout.contains("imported-refresh-1"))
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
        let file = try readTokenFile()
        XCTAssertEqual(file["access_token"] as? String, "imported-access-1")
        XCTAssertEqual(file["refresh_token"] as? String, "imported-refresh-1")
        XCTAssertEqual(file["token_type"] as? String, "Bearer")
        let expiresAt = try XCTUnwrap(file["expires_at"] as? String)
        XCTAssertGreaterThan(ISO8601DateFormatter().date(from: expiresAt)!.timeIntervalSinceNow, 500)
    }

    func testImportFromFileIsPickedUpByARunningRelay() throws {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 200)
        try latchLoginRequired(relay)

        tokenServer.failureMode = .normal
        let fresh = tokenServer.issueInitialTokens()
        let source = workDir.appendingPathComponent("new-tokens.json")
        try JSONSerialization.data(withJSONObject: ["access_token": fresh.access, "refresh_token": fresh.refresh]).write(to: source)
        let result = try run(["token", "import", "--config", relay.configURL.path, "--from", source.path])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 200 })
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testImportRejectsBadInputAndLeavesTheFileAlone() throws {
        let before = try Data(contentsOf: tokenFileURL)
        let config = try writeConfig().path
        for (input, expected) in [("not json", "is not valid JSON"), ("[]", "not a JSON object"),
                                  (#"{"access_token":"a","refresh_token":"r","access_token":"b"}"#, "duplicate key access_token at line 1"),
                                  (#"{"access_token":5,"refresh_token":"r"}"#, "access_token"),
                                  (#"{"access_token":"a b"}"#, "not allowed in an HTTP header"),
                                  (#"{"access_token":"a"}"#, "refresh_token is required"),
                                  (#"{"access_token":"a","refresh_token":"r","expires_in":1,"expires_at":2}"#, "either expires_in or expires_at")] {
            let result = try run(["token", "import", "--config", config], stdin: Data(input.utf8))
            XCTAssertNotEqual(result.exitCode, 0, input)
            XCTAssertTrue(result.stderr.contains(expected), "\(input): \(result.stderr)")
        }
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), before)
    }

    func testImportWithoutRefreshTokenForClientCredentials() throws {
        let config = try writeConfig(["refresh": ["grant": "client_credentials"]]).path
        let result = try run(["token", "import", "--config", config], stdin: Data(#"{"access_token":"cc-access","expires_at":1893456000}"#.utf8))
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertEqual(try readTokenFile()["expires_at"] as? String, "2030-01-01T00:00:00Z")
    }

    /// The first 12 hex digits of SHA-256, computed independently of the product (sha256sum).
    private func sha256Prefix(_ text: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
        let input = Pipe(), output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return String(String(decoding: data, as: UTF8.self).prefix(12))
    }
}
