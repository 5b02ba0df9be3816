import Foundation
import XCTest

/// tokenrelay as an independent tester sees it (`OAuthProbeServer`: a strict token endpoint and DPoP API written
/// apart from tokenrelay and the other fixtures): private_key_jwt and DPoP together, answers that are odd but
/// legal, nonces on both sides, rotation with reuse detection, restarts; and what must never be logged.
final class DPoPProbeTests: XCTestCase {
    private var workDir: URL!
    private var server: OAuthProbeServer!
    private var relays: [TokenRelayProcess] = []
    private var tokenFileURL: URL { workDir.appendingPathComponent("tokens.json") }

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory(prefix: "tokenrelay-dpop-probe")
    }

    override func tearDownWithError() throws {
        relays.forEach { $0.stop() }
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0 {
            for relay in relays { print("--- relay log:\n" + relay.stderrText.split(separator: "\n").suffix(40).joined(separator: "\n")) }
            if let server { print("--- probe server stderr:\n\(server.stderrText.suffix(3000))\nfailures: \((try? server.stats()["failures"]) ?? [])") }
        }
        relays = []
        server?.stop()
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    @discardableResult
    private func startRelay(upstream: String, refresh: [String: Any], dpop: [String: Any]) throws -> TokenRelayProcess {
        let directory = workDir.appendingPathComponent("relay-\(relays.count)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        var refreshObject: [String: Any] = ["token_url": server.tokenURL, "client_id": "c1", "grant": "refresh_token", "client_auth": "none",
                                            "backoff_seconds": 0.05]
        refreshObject.merge(refresh) { _, new in new }
        let config: [String: Any] = [
            "listen": "127.0.0.1:0",
            "upstream": ["url": upstream],
            "tokens": ["file": tokenFileURL.path, "watch_interval_seconds": 0.2],
            "refresh": refreshObject,
            "admin": ["listen": "127.0.0.1:0"],
            "log": ["level": "debug", "access": true],
            "dpop": dpop,
        ]
        let relay = try TokenRelayProcess.start(config: config, workDir: directory)
        relays.append(relay)
        return relay
    }

    private func assertNoFailures(file: StaticString = #filePath, line: UInt = #line) throws {
        let stats = try server.stats()
        XCTAssertEqual(stats["failures"] as? [String], [], file: file, line: line)
        XCTAssertEqual(stats["reuse"] as? Int, 0, "a refresh token was presented twice", file: file, line: line)
    }

    /// None of `secrets` in the running `relay`'s log, /status and /metrics, nor in the logs of `stoppedRelays`.
    private func assertNothingLeaks(_ relay: TokenRelayProcess, _ secrets: [String], stoppedRelays: [TokenRelayProcess] = [],
                                    file: StaticString = #filePath, line: UInt = #line) throws {
        let places = [("log", ([relay] + stoppedRelays).map { $0.stderrText + $0.stdoutText }.joined()),
                      ("/status", try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/status").bodyText),
                      ("/metrics", try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").bodyText)]
        for secret in secrets {
            for (place, text) in places {
                XCTAssertFalse(text.contains(secret.prefix(24)), "a secret (\(secret.prefix(6))…) reached \(place)", file: file, line: line)
            }
        }
    }

    /// private_key_jwt (ES256, kid, an audience apart from a token URL with a query) and DPoP (EdDSA) against a
    /// server that checks both like an IdP: every method with a query and the client's own DPoP and
    /// Authorization fields, through an upstream with a base path; answers with `token_type: "dpop"`,
    /// `expires_in` as a string and extra members; nonces required on both sides, the token endpoint's rotated on
    /// every answer; then expiry and a restart. Every proof, assertion and refresh passes; nothing secret is logged.
    func testPrivateKeyJWTAndDPoPPassAStrictIndependentServer() throws {
        let clientKey = try TestKeys.make(.p256, in: workDir)
        server = try OAuthProbeServer(settings: [
            "client_id": "c1", "client_keys": ["ES256": clientKey.path], "expect_kid": "k1", "api_base": "/base",
            "token_type": "dpop", "expires_in": "3600", "token_nonce": true, "rotate_token_nonce": true, "api_nonce": true,
            "extra": ["scope": "a b", "x_vendor": ["nested": [1, 2]], "id_token": NSNull()],
        ], workDir: workDir)
        try writeTokenFile(at: tokenFileURL, access: "not-yet-issued", refresh: "rt0")
        let refresh: [String: Any] = ["token_url": server.tokenURL + "?tenant=t1", "client_auth": "private_key_jwt",
                                      "client_key_file": clientKey.path, "client_key_id": "k1", "client_assertion_audience": server.tokenURL]
        var relay = try startRelay(upstream: server.apiURL + "/base", refresh: refresh, dpop: ["alg": "EdDSA"])
        for (index, method) in ["GET", "POST", "PUT", "PATCH", "DELETE", "GET"].enumerated() {
            let response = try HTTPTestClient.send(port: relay.proxyPort, method: method, path: "/items/\(index)?q=\(index)",
                                                   headers: [("DPoP", "client-own-proof"), ("Authorization", "Bearer client-own")],
                                                   body: method == "GET" || method == "DELETE" ? nil : Data("{}".utf8))
            XCTAssertEqual(response.status, 200, "\(method) \(response.bodyText)")
        }
        try server.expireAccessTokens()
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/after-expiry").status, 200)
        relay.stop()
        relay = try startRelay(upstream: server.apiURL + "/base", refresh: refresh, dpop: ["alg": "EdDSA"])
        try server.expireAccessTokens()
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/after-restart").status, 200)
        try assertNoFailures()
        XCTAssertEqual(try server.count("granted"), 3)
        let secrets = try server.secretsSeen()
        XCTAssertGreaterThan(secrets.count, 10)
        try assertNothingLeaks(relay, secrets + (try pemBody(clientKey)), stoppedRelays: [relays[0]])
    }

    /// RFC 9449 §8/§9: the token endpoint's nonce and the API's are each used only with the server that issued
    /// it, also when both are at one origin. Kept in one place per origin, each refresh sent the API's nonce to
    /// the token endpoint and the token endpoint's to the API: two challenges and two resends per refresh.
    func testTheTokenEndpointsNonceIsKeptApartFromAnAPIAtTheSameOrigin() throws {
        server = try OAuthProbeServer(settings: ["client_auth": "none", "token_type": "DPoP", "api_on_token_port": true, "api_base": "/api",
                                                 "token_nonce": true, "api_nonce": true], workDir: workDir)
        try writeTokenFile(at: tokenFileURL, access: "not-yet-issued", refresh: "rt0")
        let relay = try startRelay(upstream: "http://127.0.0.1:\(server.tokenPort)/api", refresh: [:], dpop: [:])
        for round in 0..<3 {
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/round/\(round)").status, 200)
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/round/\(round)/again").status, 200)
            try server.expireAccessTokens()
        }
        try assertNoFailures()
        XCTAssertEqual(try server.count("granted"), 3)
        XCTAssertEqual(try server.count("token_nonce_challenges"), 1, "the token endpoint was sent another server's nonce")
        XCTAssertEqual(try server.count("api_nonce_challenges"), 1, "the API was sent another server's nonce")
    }

    /// A token endpoint that refuses the client's assertion and echoes the whole form (refresh token, assertion)
    /// into its error description and a WWW-Authenticate realm: "client authentication refused", one request,
    /// and none of it in the log, /status or /metrics.
    func testARefusingServerThatEchoesTheFormLeaksNothing() throws {
        let clientKey = try TestKeys.make(.p256, in: workDir)
        let registered = try TestKeys.make(.p256, in: workDir)
        server = try OAuthProbeServer(settings: ["client_keys": ["ES256": registered.path], "echo_on_reject": true, "token_nonce": true],
                                      workDir: workDir)
        try writeTokenFile(at: tokenFileURL, access: "access-token-seed-0123456789", refresh: "refresh-token-seed-0123456789")
        let relay = try startRelay(upstream: server.apiURL, refresh: ["client_auth": "private_key_jwt", "client_key_file": clientKey.path], dpop: [:])
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/x").status, 401)
        let ready = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/readyz")
        XCTAssertEqual(ready.status, 503)
        XCTAssertTrue(ready.bodyText.contains("client authentication refused"), ready.bodyText)
        XCTAssertEqual(try server.count("token_requests"), 2, "one nonce challenge, then the refused request; no storm")
        try assertNothingLeaks(relay, try server.secretsSeen() + ["refresh-token-seed-0123456789", "access-token-seed-0123456789"] + (try pemBody(clientKey)))
    }

    /// RFC 9449 §5: a token endpoint that refuses the proof (`400 invalid_dpop_proof`: its alg policy, a clock
    /// apart) refused it before looking at the grant: the refresh token is fine and a new login cannot help. It
    /// latches like a refused client credential (kept refresh token, nothing latched in a shared store, the
    /// reason named), and `POST /refresh` asks again once the cause is gone. It latched "login required".
    func testARefusedDPoPProofKeepsTheRefreshTokenAndIsNotALoginRequired() throws {
        server = try OAuthProbeServer(settings: ["client_auth": "none", "token_type": "DPoP", "refuse_dpop_proof": true], workDir: workDir)
        try writeTokenFile(at: tokenFileURL, access: "not-yet-issued", refresh: "rt0")
        let relay = try startRelay(upstream: server.apiURL, refresh: [:], dpop: [:])
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/refused").status, 401)
        let ready = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/readyz")
        XCTAssertEqual(ready.status, 503)
        XCTAssertFalse(ready.bodyText.contains("login required"), ready.bodyText)
        XCTAssertTrue(relay.stderrText.contains("the token endpoint refused the DPoP proof"), relay.stderrText)
        XCTAssertEqual(try server.count("token_requests"), 1, "no storm")
        try server.set("refuse_dpop_proof", "false")
        XCTAssertEqual(try HTTPTestClient.send(port: relay.adminPort, method: "POST", path: "/refresh", body: Data()).status, 200)
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/recovered").status, 200)
        try assertNoFailures()
        XCTAssertEqual(try server.count("granted"), 1)
    }

    private func pemBody(_ url: URL) throws -> [String] {
        try String(contentsOf: url, encoding: .utf8).split(separator: "\n").filter { !$0.hasPrefix("-----") }.map(String.init)
    }
}
