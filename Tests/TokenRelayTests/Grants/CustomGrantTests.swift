import Foundation
import XCTest

/// `refresh.grant: custom` against a seed-style backend: POST /auth/token with the refresh token in a
/// header and client credentials in a JSON body, tokens nested under /data, rotation with reuse
/// detection on every refresh, and the token injected as `accessToken: <token>`.
final class CustomGrantTests: RelayTestCase {
    override func setUpWithError() throws {
        try super.setUpWithError()
        api.stop()
        api = try FakeAPIServer(tokenServer: tokenServer, tokenHeader: "accessToken")
    }

    private func seedConfig(response: [String: Any] = [:]) -> [String: Any] {
        var mapping: [String: Any] = ["access_token": "/data/accessToken", "refresh_token": "/data/refreshToken",
                                      "expires_in": "/data/expiresIn"]
        mapping.merge(response) { _, new in new }
        return [
            "refresh": ["grant": "custom", "client_id": "legacy-app", "client_secret_env": "TOKENRELAY_CLIENT_SECRET",
                        "backoff_seconds": 0.05, "max_attempts": 2,
                        "request": ["method": "POST", "url": tokenServer.seedURL,
                                    "headers": ["X-Refresh-Token": "{{refresh_token}}"],
                                    "body_json": ["clientId": "{{client_id}}", "clientSecret": "{{client_secret}}"]],
                        "response": mapping],
            "inject": ["header": "accessToken", "format": "{token}"],
        ]
    }

    /// RelayTestCase's config carries token_url and client_auth, which the custom grant refuses.
    private func startSeedRelay(response: [String: Any] = [:]) throws -> TokenRelayProcess {
        var overrides = seedConfig(response: response)
        var refresh = config()["refresh"] as! [String: Any]
        refresh.removeValue(forKey: "token_url")
        refresh.removeValue(forKey: "client_auth")
        refresh.merge(overrides["refresh"] as! [String: Any]) { _, new in new }
        overrides["refresh"] = refresh
        return try startRelayReplacingRefresh(overrides)
    }

    func testRotatingRefreshThroughTheSeedEndpoint() throws {
        let relay = try startSeedRelay()
        XCTAssertEqual(try get(relay).status, 200)
        for round in 1...3 {
            tokenServer.expireAccessTokens()
            let responses = burst(10) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/r\(round)/\(i)") }
            XCTAssertEqual(statusCounts(responses), [200: 10], "round \(round)")
        }
        XCTAssertEqual(tokenServer.refreshCalls, 3, "one refresh per round")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        let seen = try XCTUnwrap(tokenServer.receivedRequests.last)
        XCTAssertEqual(seen.path, FakeTokenServer.seedPath)
        XCTAssertEqual(seen.header("Content-Type"), "application/json")
        let file = try readTokenFile()
        XCTAssertEqual(file["refresh_token"] as? String, tokenServer.currentRefreshToken, "the rotated token is persisted")
        XCTAssertEqual(file["access_token"] as? String, tokenServer.currentAccessToken)
        XCTAssertNotNil(file["expires_at"])
    }

    func testLoginRequiredErrorCodeLatchesWhateverTheStatus() throws {
        let backend = try MiniHTTPServer { _ in .json(500, ["error": ["code": "SESSION_EXPIRED"]]) }
        defer { backend.stop() }
        var config = seedConfig(response: ["error": "/error/code", "login_required_errors": ["SESSION_EXPIRED"]])
        var refresh = config["refresh"] as! [String: Any]
        var request = refresh["request"] as! [String: Any]
        request["url"] = "\(backend.baseURL)/auth/token"
        refresh["request"] = request
        config["refresh"] = refresh
        var merged = self.config()["refresh"] as! [String: Any]
        merged.removeValue(forKey: "token_url")
        merged.removeValue(forKey: "client_auth")
        merged.merge(refresh) { _, new in new }
        config["refresh"] = merged
        let relay = try startRelayReplacingRefresh(config)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 401)
        XCTAssertEqual(try admin(relay, "/readyz").status, 503, "a 500 carrying SESSION_EXPIRED means login required, not retry")
        XCTAssertTrue(try admin(relay, "/metrics").bodyText.contains("tokenrelay_refresh_errors_total{error=\"SESSION_EXPIRED\"} 1"))
    }

    func testLoginRequiredStatusLatches() throws {
        let relay = try startSeedRelay()
        try latchLoginRequired(relay)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }

    func testTransientStatusesAreRetriedAndOthersAreNot() throws {
        let relay = try startSeedRelay(response: ["login_required_statuses": [401]])
        tokenServer.failureMode = .unavailable(status: 503)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertEqual(tokenServer.refreshCalls, 2, "max_attempts 2")
        tokenServer.failureMode = .unavailable(status: 404)
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 503)
        XCTAssertEqual(tokenServer.refreshCalls, 3, "a 404 is not retried within the cycle")
        let status = try admin(relay, "/status").bodyText
        XCTAssertTrue(status.contains("\"state\":\"ready\""), "and does not latch login required: \(status)")
        tokenServer.failureMode = .normal
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testBadPointerAnswerIsAnInvalidResponse() throws {
        let relay = try startSeedRelay(response: ["access_token": "/data/missing"])
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("no usable access token at /data/missing") }, relay.stderrText)
    }

    func testCanarySecretsNeverAppearInLogs() throws {
        let relay = try startSeedRelay()
        let initialRefresh = tokenServer.currentRefreshToken!
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        tokenServer.failureMode = .rejectAll
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 401)
        let status = try admin(relay, "/status").bodyText
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertEqual(relay.stop(), 0)
        let logs = relay.stderrText + relay.stdoutText
        XCTAssertTrue(logs.contains("refresh succeeded"))
        var canaries = [Self.clientSecret, initialRefresh, tokenServer.currentRefreshToken ?? ""]
        canaries += tokenServer.receivedRequests.compactMap { $0.header("X-Refresh-Token") }
        canaries += api.requests.compactMap { $0.header("accessToken") }
        for canary in Set(canaries) where !canary.isEmpty {
            XCTAssertFalse(logs.contains(canary), "secret in logs")
            XCTAssertFalse(status.contains(canary), "secret in /status")
            XCTAssertFalse(metrics.contains(canary), "secret in /metrics")
        }
    }
}

extension RelayTestCase {
    /// Starts a relay whose `refresh` object is exactly `overrides["refresh"]` (not merged into the
    /// default one, whose token_url and client_auth another grant may refuse).
    func startRelayReplacingRefresh(_ overrides: [String: Any]) throws -> TokenRelayProcess {
        var full = config(overrides)
        full["refresh"] = overrides["refresh"]
        let directory = workDir.appendingPathComponent("relay-custom-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return try TokenRelayProcess.start(config: full, environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret], workDir: directory)
    }
}
