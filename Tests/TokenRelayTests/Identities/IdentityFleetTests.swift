import Foundation
import XCTest

/// An identity in fleet mode beside a top-level identity on a token file: `token import --identity` seeds
/// its Redis key, it serves through Redis, and a Redis outage stops only it (the top-level identity keeps
/// refreshing and serving).
final class IdentityFleetTests: RelayTestCase, SealedStateChecks {
    private var redis: RedisServerProcess!
    private var tokenServerB: FakeTokenServer!
    private var apiB: FakeAPIServer!

    override func setUpWithError() throws {
        try super.setUpWithError()
        redis = try RedisServerProcess()
        tokenServerB = try FakeTokenServer(clientID: "legacy-app", clientSecret: Self.clientSecret, accessTokenLifetime: 3600, expectedClientAuth: .basic)
        apiB = try FakeAPIServer(tokenServer: tokenServerB)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        apiB?.stop()
        tokenServerB?.stop()
        redis?.stop()
    }

    private var settings: [String: Any] {
        var settings = config(["timeouts": ["refresh_seconds": 2, "hold_seconds": 5]])
        settings["routes"] = [["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "b"]]
        settings["identities"] = ["b": [
            "tokens": ["redis": ["url": redis.url, "key": "tokenrelay:identity-b", "command_timeout_seconds": 0.5, "poll_interval_seconds": 0.1]],
            "refresh": ["grant": "refresh_token", "token_url": tokenServerB.tokenURL, "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic", "backoff_seconds": 0.05],
        ]]
        return settings
    }

    /// Seeds b's Redis key with `token import --identity b` (plain: the settings have no encryption).
    @discardableResult
    private func importIdentityB() throws -> (access: String, refresh: String) {
        let tokens = tokenServerB.issueInitialTokens()
        let seed = workDir.appendingPathComponent("seed-b.json")
        try writeTokenFile(at: seed, access: tokens.access, refresh: tokens.refresh)
        let configURL = workDir.appendingPathComponent("import.json")
        try JSONSerialization.data(withJSONObject: settings).write(to: configURL)
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--identity", "b", "--from", seed.path],
                                                        environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)
        XCTAssertEqual(try redis.cli(["EXISTS", "tokenrelay:identity-b"]).trimmingCharacters(in: .whitespacesAndNewlines), "1")
        return tokens
    }

    /// b's plain Redis value is sealed at start with b's `tokens.encryption`, as the top level's would be.
    func testAnIdentitysPlainRedisValueIsSealedAtStart() throws {
        let tokens = try importIdentityB()
        let key = try writeKey(workDir, "b-state-key")
        var sealed = settings
        var identities = sealed["identities"] as! [String: [String: Any]]
        var tokenSettings = identities["b"]!["tokens"] as! [String: Any]
        tokenSettings["encryption"] = ["key_file": key.url.path]
        identities["b"]!["tokens"] = tokenSettings
        sealed["identities"] = identities
        let relay = try startRelay(sealed)
        let stored = Data(try redis.cli(["HGET", "tokenrelay:identity-b", "tokens"]).utf8)
        XCTAssertEqual(try sealedEnvelope(stored)["key_id"] as? String, try keyID(key.bytes), "sealed before the loop ran")
        assertHoldsNone(of: [tokens.access, tokens.refresh], in: stored, "b's Redis value after the start")
        let lines = relay.stderrText.split(separator: "\n").filter { $0.contains("Redis token value sealed with tokens.encryption.key_file") }
        XCTAssertTrue(lines.count == 1 && lines[0].contains("identity=b"), relay.stderrText)
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/x").status, 200)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 0)
    }

    func testRedisOutageOfOneIdentityLeavesTheOtherServing() throws {
        try importIdentityB()

        let relay = try startRelay(settings)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/readyz").status) == 200 },
                      relay.stderrText)
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/x").status, 200)

        redis.stop()
        tokenServer.expireAccessTokens()
        tokenServerB.expireAccessTokens()
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/a/x").status, 200, "the top-level identity refreshes")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertNotEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/x").status, 200)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 0, "no refresh without its store's lock")
        XCTAssertTrue(waitUntil(timeout: 5) {
            let body = (try? HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/readyz").body) ?? Data()
            return String(decoding: body, as: UTF8.self).contains("identity b:")
        })
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/a/y").status, 200)
    }
}
