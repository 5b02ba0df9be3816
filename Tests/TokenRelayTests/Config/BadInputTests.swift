import Foundation
import XCTest

/// Bad input from the token file and the token endpoint gets one clear reason and is never used; the
/// admin endpoints give one answer about readiness.
final class BadInputTests: RelayTestCase {
    private func check() throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("check-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config()).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path],
                                                environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret], timeout: 10)
    }

    func testTokenFileThatIsADirectoryIsNamedAsSuch() throws {
        try FileManager.default.removeItem(at: tokenFileURL)
        try FileManager.default.createDirectory(at: tokenFileURL, withIntermediateDirectories: false)
        let result = try check()
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("is a directory, not a file"), result.stderr)
    }

    func testTokenFileThatIsAFIFOIsRefusedWithoutBlocking() throws {
        try FileManager.default.removeItem(at: tokenFileURL)
        XCTAssertEqual(mkfifo(tokenFileURL.path, 0o600), 0)
        let result = try check()
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("is not a regular file"), result.stderr)
        XCTAssertFalse(result.stderr.contains("Success"), result.stderr)
    }

    func testOversizedAccessTokenInTheTokenFileIsRefused() throws {
        try writeTokenFile(at: tokenFileURL, access: String(repeating: "a", count: 100_000), refresh: "r")
        let result = try check()
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("access_token is longer than 16384 bytes"), result.stderr)
    }

    func testOversizedAccessTokenFromTheTokenEndpointIsNeverSent() throws {
        let huge = String(repeating: "h", count: 100_000)
        let endpoint = try MiniHTTPServer { _ in .json(200, ["access_token": huge, "expires_in": 3600]) }
        defer { endpoint.stop() }
        let relay = try startRelay(["refresh": ["token_url": "\(endpoint.baseURL)/token"]])
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 503)
        XCTAssertTrue(relay.stderrText.contains("access_token is longer than 16384 bytes"), relay.stderrText)
        XCTAssertEqual(try get(relay, "/after").status, 200, "the previous token stays in service")
        XCTAssertFalse(api.requests.contains { ($0.header("Authorization") ?? "").count > 16_384 })
    }

    /// A file refused for its mode is looked at again once the operator runs the chmod the log asks for
    /// (chmod changes neither content nor modification time, only the status-change time).
    func testAFixedModeIsNoticedWithoutATouch() throws {
        let relay = try startRelay()
        try latchLoginRequired(relay)
        tokenServer.failureMode = .normal
        let fresh = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: fresh.access, refresh: fresh.refresh, mode: 0o644)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("run chmod 600") }, relay.stderrText)
        XCTAssertEqual(chmod(tokenFileURL.path, 0o600), 0)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 200 }, relay.stderrText)
    }

    func testStatusAndReadinessGiveOneAnswer() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 1]])
        tokenServer.failureMode = .unavailable(status: 500)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503)
        let readiness = try admin(relay, "/readyz")
        XCTAssertEqual(readiness.status, 503)
        let status = try XCTUnwrap(JSONSerialization.jsonObject(with: admin(relay, "/status").body) as? [String: Any])
        XCTAssertEqual(status["ready"] as? Bool, false, "\(status)")
        let reason = try XCTUnwrap(status["not_ready_reason"] as? String, "\(status)")
        XCTAssertTrue(readiness.bodyText.contains(reason), "\(readiness.bodyText) vs \(reason)")
        XCTAssertEqual(status["degraded_reason"] as? String, reason)
    }
}
