import Foundation
import XCTest

/// A config with `routes` and `identities` only (no top-level `upstream`, `tokens` or `refresh`), run for
/// real: identity `a` (the usual token server and API) behind `/a/`, `b` (its own) behind `/b/`. Nothing
/// runs for the top level: the admin answers for the identities, the CLI asks which one.
final class IdentitiesOnlyTests: SecondIdentityTestCase {
    /// a's own file (a token family of its own): the top-level `tokens.json` stays the top level's, for the reload test.
    private var tokenFileA: URL { workDir.appendingPathComponent("tokens-a.json") }

    override func setUpWithError() throws {
        try super.setUpWithError()
        let tokensA = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileA, access: tokensA.access, refresh: tokensA.refresh)
    }

    private func identity(_ file: URL, _ server: FakeTokenServer) -> [String: Any] {
        ["tokens": ["file": file.path, "watch_interval_seconds": 0.2],
         "refresh": ["grant": "refresh_token", "token_url": server.tokenURL, "client_id": "legacy-app",
                     "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic", "backoff_seconds": 0.05]]
    }

    private var routesAndIdentities: [String: Any] {
        ["routes": [["name": "a", "match": ["path_prefix": "/a/", "strip_prefix": true], "upstream": ["url": api.baseURL], "identity": "a"],
                    ["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "b"]],
         "identities": ["a": identity(tokenFileA, tokenServer), "b": identity(tokenFileB, tokenServerB)]]
    }

    /// The overrides that take the top-level identity and route out of `config()`.
    private var identitiesOnly: [String: Any] {
        routesAndIdentities.merging(["upstream": NSNull(), "tokens": NSNull(), "refresh": NSNull()]) { $1 }
    }

    private func admin(_ relay: TokenRelayProcess, _ method: String, _ path: String) throws -> (status: Int, json: [String: Any]) {
        let response = try HTTPTestClient.send(port: relay.adminPort, method: method, path: path)
        return (response.status, (try JSONSerialization.jsonObject(with: response.body) as? [String: Any]) ?? [:])
    }

    func testRoutesAndIdentitiesAloneServeAndTheAdminAnswersForTheIdentities() throws {
        let relay = try startRelay(identitiesOnly)
        XCTAssertEqual(try get(relay, "/a/x").status, 200)
        XCTAssertEqual(try get(relay, "/b/y").status, 200)
        XCTAssertEqual(try get(relay, "/elsewhere").status, 404)
        XCTAssertEqual(api.requests.map(\.target), ["/x"])
        XCTAssertEqual(apiB.requests.map(\.target), ["/y"])

        let ready = try admin(relay, "GET", "/readyz")
        XCTAssertEqual(ready.status, 200, "\(ready.json)")
        XCTAssertNil(ready.json["state"], "no top-level identity, no top-level state")
        XCTAssertEqual((ready.json["identities"] as? [String: Any]).map { Set($0.keys) }, ["a", "b"])
        let status = try admin(relay, "GET", "/status")
        XCTAssertEqual((status.json["identities"] as? [String: Any]).map { Set($0.keys) }, ["a", "b"])
        XCTAssertNil(status.json["generation"], "no identity's fields at the top: \(status.json)")
        XCTAssertEqual(status.json["ready"] as? Bool, true)
        XCTAssertNotNil(status.json["active_requests"], "the process's own figures stay")

        let unnamed = try admin(relay, "POST", "/refresh")
        XCTAssertEqual(unnamed.status, 400)
        XCTAssertEqual(unnamed.json["error"] as? String, "identity_required")
        XCTAssertTrue((unnamed.json["reason"] as? String)?.contains("?identity=NAME (identities: a, b)") ?? false, "\(unnamed.json)")
        XCTAssertEqual(try admin(relay, "POST", "/refresh?identity=a").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 0)

        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains(#"tokenrelay_token_generation{identity="a"}"#), metrics)
        XCTAssertTrue(metrics.contains(#"tokenrelay_token_generation{identity="b"}"#), metrics)
        XCTAssertFalse(metrics.contains(#"identity="default""#), "no series for an identity that does not exist")

        // Ready when every identity is: b latched, a serves.
        tokenServerB.failureMode = .rejectAll
        tokenServerB.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/b/latched").status, 401)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "GET", "/readyz").status) == 503 })
        XCTAssertEqual(try admin(relay, "GET", "/readyz").json["reason"] as? String, "identity b: login required")
        XCTAssertEqual(try admin(relay, "GET", "/readyz/a").status, 200)
        XCTAssertEqual(try get(relay, "/a/still").status, 200)
        XCTAssertEqual(tokenServer.reuseDetections + tokenServerB.reuseDetections, 0)
    }

    func testCheckAcceptsItAndTheCommandsAskForAnIdentity() throws {
        let url = workDir.appendingPathComponent("identities-only.json")
        try writeConfig(config(identitiesOnly), to: url)
        let environment = ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret]
        let check = try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path], environment: environment)
        XCTAssertEqual(check.exitCode, 0, check.stderr)
        XCTAssertTrue(check.stdout.contains("no top-level identity, each route names one of identities a, b"), check.stdout)
        let before = try Data(contentsOf: tokenFileB)
        let input = Data(#"{"access_token":"x-access","refresh_token":"x-refresh","expires_in":600}"#.utf8)
        for arguments in [["token", "show"], ["token", "import"], ["login"]] {
            let result = try TokenRelayProcess.runCommand(arguments: arguments + ["--config", url.path], environment: environment, stdin: input)
            XCTAssertNotEqual(result.exitCode, 0, "\(arguments)")
            XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
            XCTAssertTrue(result.stderr.contains("--identity: is required: this config has no top-level tokens (identities: a, b)"), result.stderr)
        }
        XCTAssertEqual(try Data(contentsOf: tokenFileB), before, "nothing written")
        let shown = try TokenRelayProcess.runCommand(arguments: ["token", "show", "--config", url.path, "--identity", "b"], environment: environment)
        XCTAssertEqual(shown.exitCode, 0, shown.stderr)
        XCTAssertTrue(shown.stdout.contains(tokenFileB.path), shown.stdout)
    }

    /// Adding or removing the top-level identity needs a restart: the reload says so in its one line and
    /// the running config stays, in both directions.
    func testAReloadAddingOrRemovingTheTopLevelIdentityIsRefused() throws {
        let without = try startRelay(identitiesOnly)
        try reload(without, routesAndIdentities)
        XCTAssertTrue(without.stderrText.contains("config reload failed; the running config stays"), without.stderrText)
        XCTAssertTrue(without.stderrText.contains("tokens: the reload adds a top-level identity (tokens, refresh); that needs a restart"))
        XCTAssertEqual(try get(without, "/elsewhere").status, 404, "still no top-level route")
        XCTAssertEqual(try get(without, "/a/x").status, 200)
        without.stop()

        let with = try startRelay(["routes": [["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL],
                                               "identity": "b"]],
                                   "identities": ["b": identity(tokenFileB, tokenServerB)]])
        try reload(with, identitiesOnly)
        XCTAssertTrue(with.stderrText.contains("tokens: the reload removes the top-level identity (tokens, refresh); that needs a restart"),
                      with.stderrText)
        XCTAssertEqual(try get(with, "/elsewhere").status, 200, "the top-level route and identity still serve")
        XCTAssertEqual(api.requests.last?.target, "/elsewhere")
        XCTAssertEqual(try get(with, "/b/y").status, 200)
    }
}
