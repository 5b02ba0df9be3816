import Foundation
import XCTest

/// Tokens and the client secret must never leave through logs, errors, /status or /metrics.
final class SecretHygieneTests: RelayTestCase {
    func testClientAuthorizationIsReplaced() throws {
        let relay = try startRelay()
        let response = try get(relay, "/whoami", headers: [("Authorization", "Bearer client-supplied"), ("authorization", "Basic Zm9vOmJhcg==")])
        XCTAssertEqual(response.status, 200)
        let seen = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(seen.headers(named: "Authorization"), ["Bearer \(tokenServer.currentAccessToken!)"])
    }

    func testCanarySecretsNeverAppearInTextLogsStatusOrMetrics() throws {
        try assertNoCanaries(logFormat: "text")
    }

    func testCanarySecretsNeverAppearInJSONLogs() throws {
        let relay = try assertNoCanaries(logFormat: "json")
        for line in relay.stderrText.split(separator: "\n") {
            let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            XCTAssertNotNil(object?["msg"], "not a JSON log line: \(line)")
        }
    }

    @discardableResult
    private func assertNoCanaries(logFormat: String) throws -> TokenRelayProcess {
        let relay = try startRelay(["log": ["level": "trace", "format": logFormat]])
        let initialAccess = tokenServer.currentAccessToken!
        let initialRefresh = tokenServer.currentRefreshToken!
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        tokenServer.failureMode = .rejectAll
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 401)

        let status = try admin(relay, "/status").bodyText
        let metrics = try admin(relay, "/metrics").bodyText
        let readiness = try admin(relay, "/readyz").bodyText
        XCTAssertEqual(relay.stop(), 0)
        let logs = relay.stderrText + relay.stdoutText
        XCTAssertTrue(logs.contains("refresh succeeded"), "the log must have covered the refreshes")

        var canaries = [Self.clientSecret, initialAccess, initialRefresh, tokenServer.currentRefreshToken ?? ""]
        canaries += tokenServer.receivedRequests.compactMap { FakeTokenServer.parseForm($0.bodyText)["refresh_token"] }
        canaries += api.requests.compactMap(\.bearerToken)
        for canary in Set(canaries) where !canary.isEmpty {
            XCTAssertFalse(logs.contains(canary), "secret in logs")
            XCTAssertFalse(status.contains(canary), "secret in /status")
            XCTAssertFalse(metrics.contains(canary), "secret in /metrics")
            XCTAssertFalse(readiness.contains(canary), "secret in /readyz")
        }
        return relay
    }

    func testConfigErrorsDoNotEchoTheSecret() throws {
        let secretFile = workDir.appendingPathComponent("secret")
        try Data("canary-file-secret-99".utf8).write(to: secretFile)
        var broken = config(["refresh": ["client_secret_env": NSNull(), "client_secret_file": secretFile.path, "client_auth": "basic"]])
        broken["refresh"] = (broken["refresh"] as! [String: Any]).filter { !($0.value is NSNull) }
        let configURL = workDir.appendingPathComponent("broken.json")
        try JSONSerialization.data(withJSONObject: broken).write(to: configURL)
        let result = try TokenRelayProcess.runCommand(arguments: ["check", "--config", configURL.path])
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("refresh.client_auth"), result.stderr)
        XCTAssertFalse(result.stderr.contains("canary-file-secret-99"))
    }
}
