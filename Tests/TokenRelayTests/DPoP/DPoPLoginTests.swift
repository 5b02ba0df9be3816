import Foundation
import XCTest

/// `tokenrelay login` (device flow) with `dpop`: the polls carry proofs signed with the key the relay then
/// uses (kept with the token state), nonces are met, and the relay serves with the bound tokens at once.
/// Against the DPoP token server and API (`DPoPServer`), which verify every proof.
final class DPoPLoginTests: XCTestCase {
    private var workDir: URL!
    private var server: DPoPServer!
    private var relay: TokenRelayProcess?
    private var tokenFileURL: URL { workDir.appendingPathComponent("tokens.json") }

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory(prefix: "tokenrelay-dpop-login")
    }

    override func tearDownWithError() throws {
        relay?.stop()
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0, let server {
            print("--- dpop server stderr:\n\(server.stderrText.suffix(3000))\nstats: \((try? server.stats()) ?? [:])")
        }
        server?.stop()
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    private func config(dpop: Bool) -> [String: Any] {
        var config: [String: Any] = [
            "listen": "127.0.0.1:0",
            "upstream": ["url": server.apiURL],
            "tokens": ["file": tokenFileURL.path],
            "refresh": ["token_url": server.tokenURL, "client_id": "relay-client", "grant": "refresh_token", "client_auth": "none"],
            "login": ["device_authorization_url": "http://127.0.0.1:\(server.tokenPort)/device"],
            "admin": ["listen": "127.0.0.1:0"],
        ]
        if dpop { config["dpop"] = [:] }
        return config
    }

    private func login(_ config: [String: Any]) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("login-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["login", "--config", url.path, "--poll-interval-scale", "0.01"], timeout: 30)
    }

    func testDeviceLoginPollsWithProofsAndTheRelayServesWithTheBoundTokens() throws {
        server = try DPoPServer(settings: ["refresh_token": "rt-unused", "token_nonce_every": 1, "device_pending_polls": 2], workDir: workDir)
        let result = try login(config(dpop: true))
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("logged in; tokens written to"), result.stdout)

        let stats = try server.stats()
        XCTAssertEqual(stats["proof_failures"] as? [String], [], "every poll carried a proof the server verified")
        XCTAssertEqual(stats["device_granted"] as? Int, 1)
        XCTAssertEqual(stats["device_polls"] as? Int, 3, "two pending polls, then the grant")
        XCTAssertGreaterThanOrEqual(stats["token_nonce_challenges"] as? Int ?? 0, 1, "the token endpoint's nonce was asked for and met")
        XCTAssertEqual(stats["jti_reuse"] as? Int, 0)
        let jkt = try XCTUnwrap((stats["jkts"] as? [String])?.first)
        let stored = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        XCTAssertEqual(stored["dpop_jkt"] as? String, jkt, "the tokens are bound to the key written beside them")
        let pem = try XCTUnwrap(stored["dpop_key"] as? String)
        let output = result.stdout + result.stderr
        for secret in ["dc-secret", "at-", "rt-", "eyJ0eXAiOiJkcG9wK2p3dCIs", String(pem.split(separator: "\n")[1])] {
            XCTAssertFalse(output.contains(secret), "login printed a secret: \(secret.prefix(8))")
        }

        // The relay signs with the key the login used: its requests work with the bound token, no refresh.
        let relay = try TokenRelayProcess.start(config: config(dpop: true), workDir: workDir)
        self.relay = relay
        for index in 0..<4 {
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/items/\(index)").status, 200)
        }
        let after = try server.stats()
        XCTAssertEqual(after["granted"] as? Int, 1, "the login's grant only: no refresh")
        XCTAssertEqual(after["proof_failures"] as? [String], [])
        XCTAssertFalse(relay.stderrText.contains("dpop: generated"), "the relay uses the login's key")
    }

    /// A relay running with a key it generated but has not written yet (no bound tokens: it writes the key with
    /// the first ones), then `login`: the login finds no key in the file, generates its own and writes it with the
    /// tokens bound to it. The relay adopts the tokens AND their key, so it presents them with the key they are
    /// bound to — before, it kept its own key, the API refused the token and the relay asked for a login again.
    func testARelayRunningWithAnUnwrittenKeyAdoptsTheKeyALoginWroteWithItsTokens() throws {
        server = try DPoPServer(settings: ["refresh_token": "rt-unused", "token_nonce_every": 1, "device_pending_polls": 1], workDir: workDir)
        try writeTokenFile(at: tokenFileURL, access: "not-yet-issued", refresh: "rt-not-bound")
        var relayConfig = config(dpop: true)
        relayConfig["tokens"] = ["file": tokenFileURL.path, "watch_interval_seconds": 0.1]
        let relay = try TokenRelayProcess.start(config: relayConfig, workDir: workDir)
        self.relay = relay
        XCTAssertTrue(relay.stderrText.contains("dpop: generated"), "the relay generated a key at start")
        let status = { try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/status").json()?["dpop"] as? [String: Any] }
        let relayKey = try XCTUnwrap(try status()?["jkt"] as? String)
        let before = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        XCTAssertNil(before["dpop_key"], "the relay's key is not written before it has bound tokens")

        let result = try login(relayConfig)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        let loginKey = try XCTUnwrap((try server.stats()["jkts"] as? [String])?.first)
        XCTAssertNotEqual(loginKey, relayKey, "the login generated a key of its own (the relay's was not in the file)")
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("adopted tokens written to the token file") }, relay.stderrText)
        XCTAssertEqual(try status()?["jkt"] as? String, loginKey, "the relay signs with the key the adopted tokens are bound to")
        XCTAssertTrue(relay.stderrText.contains("dpop: the adopted tokens are bound to the key kept with them (jkt \(loginKey))"), relay.stderrText)

        for index in 0..<4 {
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: index % 2 == 0 ? "GET" : "POST", path: "/after-login/\(index)",
                                                   body: index % 2 == 0 ? nil : Data("{}".utf8)).status, 200)
        }
        let stats = try server.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1, "the login's grant only: no refresh, no login asked for again")
        XCTAssertEqual(stats["proof_failures"] as? [String], [])
        XCTAssertEqual(stats["jti_reuse"] as? Int, 0)
        XCTAssertFalse(relay.stderrText.contains("bound to another DPoP key"), relay.stderrText)
        XCTAssertFalse(relay.stderrText.contains("PRIVATE KEY"), "a key was logged")
        // The key in the file is still the login's (the relay's own was never written over it).
        let after = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        XCTAssertEqual(after["dpop_jkt"] as? String, loginKey)
    }

    func testADPoPAnswerToALoginWithoutDPoPNamesTheMissingBlock() throws {
        server = try DPoPServer(settings: ["refresh_token": "rt-unused", "require_proof": false, "token_nonce": false], workDir: workDir)
        let result = try login(config(dpop: false))
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("add a \"dpop\" block"), result.stderr)
        XCTAssertFalse(FileManager.default.fileExists(atPath: tokenFileURL.path), "nothing written")
    }
}
