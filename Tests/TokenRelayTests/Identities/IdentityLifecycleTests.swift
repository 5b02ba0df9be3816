import Foundation
import XCTest

/// A named identity over its life: it watches its own `refresh.client_secret_file` as the top level does
/// (a refusal of the old secret recovers when the file is replaced), and a reload that removes it takes its
/// series out of /metrics.
final class IdentityLifecycleTests: ReloadTestCase {
    private var tokenServerB: FakeTokenServer!
    private var apiB: FakeAPIServer!
    private var tokenFileB: URL { workDir.appendingPathComponent("tokens-b.json") }
    private var secretFileB: URL { workDir.appendingPathComponent("client_secret_b") }

    override func setUpWithError() throws {
        try super.setUpWithError()
        tokenServerB = try FakeTokenServer(clientID: "app-b", clientSecret: Self.clientSecret, accessTokenLifetime: 3600, expectedClientAuth: .basic)
        apiB = stoppedInTearDown(try FakeAPIServer(tokenServer: tokenServerB))
        let tokens = tokenServerB.issueInitialTokens()
        try writeTokenFile(at: tokenFileB, access: tokens.access, refresh: tokens.refresh)
        try Data("\(Self.clientSecret)\n".utf8).write(to: secretFileB)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        tokenServerB?.stop()
    }

    private var withB: [String: Any] {
        ["routes": [["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "b"]],
         "identities": ["b": [
            "tokens": ["file": tokenFileB.path, "watch_interval_seconds": 0.2],
            "refresh": ["grant": "refresh_token", "token_url": tokenServerB.tokenURL, "client_id": "app-b",
                        "client_secret_file": secretFileB.path, "client_auth": "client_secret_basic", "backoff_seconds": 0.05],
         ]]]
    }

    private func replaceSecretFileB(with text: String) throws {
        let temporary = workDir.appendingPathComponent("client_secret_b.new")
        try Data(text.utf8).write(to: temporary)
        guard rename(temporary.path, secretFileB.path) == 0 else { throw TestSupportError(errnoContext: "rename") }
    }

    func testAnIdentityWatchesItsOwnClientSecretFile() throws {
        try assertSecretFileWatched(try startRelay(withB))
    }

    /// A reload asking for another `watch_interval_seconds` (a token setting: it waits for a restart, and the
    /// reload line says so) leaves the running interval in force, for the secret watch too.
    func testAReloadKeepsTheRunningWatchIntervalUntilARestart() throws {
        let relay = try startRelay(withB)
        var slower = withB
        var identities = slower["identities"] as! [String: [String: Any]]
        identities["b"]!["tokens"] = ["file": tokenFileB.path, "watch_interval_seconds": 3600]
        slower["identities"] = identities
        try reload(relay, slower)
        XCTAssertTrue(relay.stderrText.contains("identities.b.tokens: changing it needs a restart"), relay.stderrText)
        try assertSecretFileWatched(relay)
    }

    /// b's server switches secret: b latches "client authentication refused"; replacing b's secret file
    /// (seen within the running watch interval) brings b back with one refresh.
    private func assertSecretFileWatched(_ relay: TokenRelayProcess) throws {
        let rotated = "rotated-b-\(UUID().uuidString.prefix(8))"
        tokenServerB.clientSecret = rotated  // b's old secret now gets 401 invalid_client
        tokenServerB.expireAccessTokens()
        XCTAssertNotEqual(try get(relay, "/b/refused").status, 200)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz/b").status) == 503 }, relay.stderrText)
        XCTAssertTrue(try admin(relay, "/readyz/b").bodyText.contains("client authentication refused"))
        XCTAssertEqual(try get(relay, "/a").status, 200, "the top-level identity does not notice")

        try replaceSecretFileB(with: rotated + "\n")
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz/b").status) == 200 }, relay.stderrText)
        XCTAssertEqual(try get(relay, "/b/recovered").status, 200, relay.stderrText)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 1, "asked again once the file changed, with the new secret")
        XCTAssertEqual(tokenServerB.reuseDetections, 0)
        XCTAssertEqual(tokenServer.refreshCalls, 0)
        XCTAssertTrue(relay.stderrText.contains("client secret file changed"))
        XCTAssertFalse(relay.stderrText.contains(rotated), "the new secret never reaches a log line")
    }

    func testARemovedIdentitysMetricsAreNoLongerExported() throws {
        let relay = try startRelay(withB)
        tokenServerB.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/b/x").status, 200)
        let before = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(before.contains(#"tokenrelay_login_required{identity="b"}"#), before)
        XCTAssertTrue(before.contains(#"identity="b""#) && before.contains(#"outcome="success""#), before)

        try reload(relay, ["identities": [String: Any](), "routes": [[String: Any]]()])
        XCTAssertTrue(relay.stderrText.contains("identity removed by a config reload"), relay.stderrText)
        let after = try admin(relay, "/metrics").bodyText
        XCTAssertFalse(after.contains(#"identity="b""#), after.split(separator: "\n").filter { $0.contains(#"identity="b""#) }.joined(separator: "\n"))
        XCTAssertEqual(try get(relay, "/still").status, 200)
    }

    /// A relay started without identities: a reload adding the first one used to abort the process (its
    /// identity-labelled series beside the top level's unlabelled ones); it now waits for a restart, named.
    func testAReloadAddingTheFirstIdentityKeepsTheRelayServingAndNamesTheRestart() throws {
        let relay = try startRelay()
        try reload(relay, withB)
        XCTAssertTrue(relay.isRunning, relay.stderrText)
        XCTAssertTrue(relay.stderrText.contains("needs_restart=identities") || relay.stderrText.contains("identities: changing it needs a restart"),
                      relay.stderrText)
        XCTAssertEqual(try get(relay, "/still").status, 200)
        XCTAssertEqual(try admin(relay, "/metrics").status, 200)
    }

    /// A request of an identity a reload removes, whose 401 comes after the reload: its identity's machine is
    /// stopped and no refresh will run, so it is answered 503 when the 401 comes, not held for hold_seconds.
    func testARemovedIdentitysLate401IsAnsweredAtOnce() throws {
        var config = withB
        config["timeouts"] = ["hold_seconds": 20]
        let relay = try startRelay(config)
        XCTAssertEqual(try get(relay, "/b/warm").status, 200)
        tokenServerB.expireAccessTokens()
        apiB.responseDelay = 1.5
        let port = relay.proxyPort
        let late = AsyncCall { try HTTPTestClient.send(port: port, method: "GET", path: "/b/late", timeout: 30) }
        XCTAssertTrue(waitUntil(timeout: 5) { self.apiB.requests.contains { $0.target == "/late" } })
        let started = Date()
        try reload(relay, ["identities": [String: Any](), "routes": [[String: Any]]()])
        let response = try late.wait(timeout: 30)
        XCTAssertEqual(response.status, 503, response.bodyText)
        XCTAssertLessThan(Date().timeIntervalSince(started), 8, "answered when its 401 came, not after hold_seconds (20 s)")
        XCTAssertEqual(tokenServerB.refreshCalls, 0)
        XCTAssertEqual(try get(relay, "/still").status, 200)
    }
}
