import Foundation
import XCTest

/// DPoP end to end: tokenrelay between plain clients and a DPoP token endpoint and API (`DPoPServer`) that
/// verify every proof independently (python3 `cryptography`), require nonces on both sides and rotate them,
/// bind tokens to the key and detect refresh-token reuse.
final class DPoPTests: XCTestCase {
    private var workDir: URL!
    private var server: DPoPServer!
    private var relays: [TokenRelayProcess] = []
    private var tokenFileURL: URL { workDir.appendingPathComponent("tokens.json") }

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory(prefix: "tokenrelay-dpop")
    }

    override func tearDownWithError() throws {
        relays.forEach { $0.stop() }
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0 {
            for relay in relays { print("--- relay log:\n" + (relay.stderrText + relay.stdoutText).split(separator: "\n").suffix(40).joined(separator: "\n")) }
            if let server { print("--- dpop server stderr:\n\(server.stderrText.suffix(3000))\nstats: \((try? server.stats()) ?? [:])") }
        }
        relays = []
        server?.stop()
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    private func startServer(_ settings: [String: Any] = [:]) throws {
        var settings = settings
        settings["refresh_token"] = "rt-seed"
        server = try DPoPServer(settings: settings, workDir: workDir)
        // An access token the API does not know: the first request's 401 (invalid_token) starts a refresh.
        try writeTokenFile(at: tokenFileURL, access: "not-yet-issued", refresh: "rt-seed")
    }

    @discardableResult
    private func startRelay(dpop: [String: Any] = [:]) throws -> TokenRelayProcess {
        let directory = workDir.appendingPathComponent("relay-\(relays.count)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let config: [String: Any] = [
            "listen": "127.0.0.1:0",
            "upstream": ["url": server.apiURL],
            "tokens": ["file": tokenFileURL.path, "watch_interval_seconds": 0.2],
            "refresh": ["token_url": server.tokenURL, "client_id": "relay-client", "grant": "refresh_token", "client_auth": "none",
                        "backoff_seconds": 0.05],
            "admin": ["listen": "127.0.0.1:0"],
            "log": ["level": "debug", "access": true],
            "dpop": dpop,
        ]
        let relay = try TokenRelayProcess.start(config: config, workDir: directory)
        relays.append(relay)
        return relay
    }

    private func metric(_ relay: TokenRelayProcess, _ series: String) throws -> Double? {
        let text = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").bodyText
        return text.split(separator: "\n").first { $0.hasPrefix(series + " ") }.flatMap { Double($0.dropFirst(series.count + 1)) }
    }

    /// `count` requests (GET and POST in turn) from `concurrency` clients at once; the statuses.
    private func load(_ relay: TokenRelayProcess, count: Int, concurrency: Int) -> [Int] {
        let statuses = Locked([Int](repeating: 0, count: count))
        let next = Locked(0)
        DispatchQueue.concurrentPerform(iterations: concurrency) { _ in
            while true {
                let index: Int = next.withLock { value in defer { value += 1 }; return value }
                guard index < count else { return }
                let post = index % 2 == 1
                // A client's own DPoP field must never reach the API (the API counts a second DPoP field).
                let response = try? HTTPTestClient.send(port: relay.proxyPort, method: post ? "POST" : "GET", path: "/items/\(index % 7)?page=\(index)",
                                                        headers: [("DPoP", "client-own-proof")], body: post ? Data("{\"n\":\(index)}".utf8) : nil)
                statuses.withLock { $0[index] = response?.status ?? -1 }
            }
        }
        return statuses.withLock { $0 }
    }

    private func assertProofsClean(file: StaticString = #filePath, line: UInt = #line) throws {
        let stats = try server.stats()
        XCTAssertEqual(stats["proof_failures"] as? [String], [], file: file, line: line)
        XCTAssertEqual(stats["jti_reuse"] as? Int, 0, "a jti was reused", file: file, line: line)
        XCTAssertEqual(stats["refresh_token_reuse"] as? Int, 0, "a refresh token was presented twice", file: file, line: line)
    }

    /// Many GET/POST through tokenrelay: proofs verify on both sides, nonces (required, rotated) are met by one
    /// resend, no jti is ever reused, the tokens are bound to the key kept with the token state.
    func testRequestsCarryVerifiedProofsWithNoJtiReuse() throws {
        try startServer(["token_nonce_every": 1, "api_nonce_every": 9])
        let relay = try startRelay()
        let statuses = load(relay, count: 120, concurrency: 4)
        XCTAssertEqual(statuses.filter { $0 != 200 }, [], "every request answered 200")
        try assertProofsClean()
        let stats = try server.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1, "one refresh")
        XCTAssertGreaterThanOrEqual(stats["token_nonce_challenges"] as? Int ?? 0, 1)
        XCTAssertGreaterThanOrEqual(stats["api_nonce_challenges"] as? Int ?? 0, 1)
        // The stored state names the key (kept with the tokens) and the key the tokens are bound to.
        let stored = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        let jkt = try XCTUnwrap((stats["jkts"] as? [String])?.first)
        XCTAssertEqual(stored["dpop_jkt"] as? String, jkt)
        let pem = try XCTUnwrap(stored["dpop_key"] as? String)
        XCTAssertTrue(pem.contains("PRIVATE KEY"))
        let metrics = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_dpop_key_info{jkt=\"\(jkt)\"} 1"), metrics)
        XCTAssertEqual(try metric(relay, "tokenrelay_dpop_enabled"), 1)
        let signed = try XCTUnwrap(try metric(relay, "tokenrelay_dpop_proofs_signed_total"))
        XCTAssertEqual(Int(signed), (stats["seen_jtis"] as? Int ?? -1), "every proof signed reached a server once")
        let replays = try XCTUnwrap(try metric(relay, "tokenrelay_dpop_nonce_replays_total"))
        XCTAssertEqual(Int(replays), (stats["api_nonce_challenges"] as? Int ?? 0) + (stats["token_nonce_challenges"] as? Int ?? 0))
        // Secrets never logged: no token, key, or proof in the relay's output or its metrics.
        let log = relay.stderrText + relay.stdoutText + metrics
        let pemBody = pem.split(separator: "\n").dropFirst().first.map(String.init) ?? "unreachable"
        for secret in [pemBody, "rt-seed", String(jkt.prefix(0))].filter({ !$0.isEmpty }) { XCTAssertFalse(log.contains(secret), "logged: \(secret.prefix(8))") }
        XCTAssertFalse(log.contains("eyJ0eXAiOiJkcG9wK2p3dCIs"), "a proof was logged")
        XCTAssertFalse(log.contains("at-"), "an access token was logged")
        // /status names DPoP and the thumbprint; token show prints the jkt, never the key.
        let status = try XCTUnwrap(try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/status").json())
        let dpopStatus = try XCTUnwrap(status["dpop"] as? [String: Any])
        XCTAssertEqual(dpopStatus["enabled"] as? Bool, true)
        XCTAssertEqual(dpopStatus["jkt"] as? String, jkt)
        XCTAssertGreaterThan(dpopStatus["proofs_signed"] as? Int ?? 0, 100)
        XCTAssertFalse("\(status)".contains(pemBody))
        let show = try TokenRelayProcess.runCommand(arguments: ["token", "show", "--config", relay.configURL.path])
        XCTAssertTrue(show.stdout.contains("jkt \(jkt) (kept with the token state), tokens bound to jkt \(jkt)"), show.stdout + show.stderr)
        XCTAssertFalse((show.stdout + show.stderr).contains(pemBody))
    }

    /// Bad nonces from either server (huge, non-ASCII, a quote): refused with one log line per server, never
    /// echoed in a proof or a log line. The API's challenge is then the client's answer; the token endpoint's is
    /// a transient failure (not a refused refresh token: no login is asked for).
    func testBadNoncesAreRefusedAndNeverEchoed() throws {
        let bad = [String(repeating: "N", count: 600), "caf\u{e9}-nonce", "quo\"te-nonce"]
        for (index, nonce) in bad.enumerated() {
            for side in ["api", "token"] {
                try startServer(["\(side)_nonce_value": nonce])
                let relay = try startRelay()
                let statuses = load(relay, count: 3, concurrency: 1)
                let log = { relay.stderrText + relay.stdoutText }
                if side == "api" {
                    XCTAssertEqual(statuses, [401, 401, 401], "case \(index): the challenge is the client's answer")
                    XCTAssertEqual(try server.count("granted"), 1)
                } else {
                    XCTAssertEqual(try server.count("granted"), 0, "case \(index)")
                    XCTAssertTrue(waitUntil(timeout: 5) { log().contains("without a usable DPoP-Nonce") }, "case \(index): \(log())")
                    XCTAssertFalse(log().contains("login required"), "case \(index): a nonce problem is not a refused refresh token")
                }
                XCTAssertEqual(log().components(separatedBy: "refused a DPoP-Nonce").count - 1, 1, "\(side) case \(index): one line: \(log())")
                XCTAssertFalse(log().contains(nonce), "\(side) case \(index): the nonce was echoed")
                // Only the token endpoint's good nonce (api case) was ever resent for; a refused one never.
                XCTAssertEqual(try metric(relay, "tokenrelay_dpop_nonce_replays_total"), side == "api" ? Double(try server.count("token_nonce_challenges")) : 0)
                try assertProofsClean()
                relay.stop()
                relays.removeAll()
                server.stop()
            }
        }
    }

    /// A burst after the access tokens expired: one refresh (bound refresh token, rotated, never reused), all 200.
    func testABurstAfterExpiryRefreshesOnce() throws {
        try startServer(["token_nonce_every": 1])
        let relay = try startRelay()
        XCTAssertEqual(load(relay, count: 4, concurrency: 1), [200, 200, 200, 200])
        try server.post("/expire")
        let statuses = load(relay, count: 40, concurrency: 8)
        XCTAssertEqual(statuses.filter { $0 != 200 }, [])
        XCTAssertEqual(try server.count("granted"), 2, "one refresh for the burst")
        XCTAssertGreaterThanOrEqual(try server.count("api_invalid_token"), 1)
        try assertProofsClean()
    }

    /// The API rotates its nonce under load: each challenge is answered by one resend with the new nonce,
    /// never by a refresh.
    func testTheAPIRotatingItsNonceUnderLoadCausesNoRefresh() throws {
        try startServer(["api_nonce_every": 3])
        let relay = try startRelay()
        XCTAssertEqual(load(relay, count: 2, concurrency: 1), [200, 200])
        let grantedBefore = try server.count("granted")
        for _ in 0..<3 {
            try server.post("/rotate-api-nonce")
            XCTAssertEqual(load(relay, count: 30, concurrency: 4).filter { $0 != 200 }, [])
        }
        XCTAssertEqual(try server.count("granted"), grantedBefore, "no refresh for a nonce")
        let challenges = try server.count("api_nonce_challenges")
        XCTAssertGreaterThanOrEqual(challenges, 3)
        XCTAssertEqual(Int(try XCTUnwrap(try metric(relay, "tokenrelay_dpop_nonce_replays_total"))),
                       challenges + (try server.count("token_nonce_challenges")), "each challenge resent once")
        try assertProofsClean()
    }

    /// A restart signs with the same key (kept with the token state): the bound refresh token still works.
    func testARestartKeepsTheKeyAndTheBoundRefreshTokenWorks() throws {
        try startServer()
        let relay = try startRelay()
        XCTAssertEqual(load(relay, count: 2, concurrency: 1), [200, 200])
        let jkt = try XCTUnwrap((try server.stats()["jkts"] as? [String])?.first)
        relay.stop()
        relays.removeAll()
        try server.post("/expire")
        let second = try startRelay()
        XCTAssertEqual(load(second, count: 6, concurrency: 2), [Int](repeating: 200, count: 6))
        XCTAssertEqual(try server.stats()["jkts"] as? [String], [jkt, jkt], "the same key after the restart")
        try assertProofsClean()
    }

    /// A state without the generated key (an operator's `token import`) is adopted; the renewal that follows
    /// writes the running key back beside the tokens bound to it, so a restart still signs with it.
    func testAnImportedStateKeepsTheGeneratedKey() throws {
        try startServer()
        let relay = try startRelay()
        XCTAssertEqual(load(relay, count: 2, concurrency: 1), [200, 200])
        let before = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        let pem = try XCTUnwrap(before["dpop_key"] as? String)
        let refresh = try XCTUnwrap(before["refresh_token"] as? String)
        // The import: the live refresh token, an access token the API does not know, no DPoP fields.
        try writeTokenFile(at: tokenFileURL, access: "imported-access-token", refresh: refresh)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("adopted tokens") }, relay.stderrText)
        XCTAssertEqual(load(relay, count: 2, concurrency: 1), [200, 200], relay.stderrText)
        let after = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
        XCTAssertNotEqual(after["refresh_token"] as? String, refresh, "renewed after the import")
        // Compared, never printed: a failure message must not carry the key.
        XCTAssertTrue(after["dpop_key"] as? String == pem, "the running key is written with the tokens bound to it")
        try assertProofsClean()
    }

    /// A new key_file: one line at start, and the bound refresh token is not presented with the wrong key.
    func testAKeyChangeAsksForANewLoginInsteadOfPresentingTheBoundRefreshToken() throws {
        try startServer(["token_nonce": false, "api_nonce": false])
        let relay = try startRelay()
        XCTAssertEqual(load(relay, count: 1, concurrency: 1), [200])
        relay.stop()
        relays.removeAll()
        let keyFile = try TestKeys.make(.p256, in: workDir)
        let second = try startRelay(dpop: ["key_file": keyFile.path])
        XCTAssertTrue(second.stderrText.contains("dpop: the key changed"), second.stderrText)
        let requestsBefore = try server.count("token_requests")
        let status = load(second, count: 1, concurrency: 1)[0]
        XCTAssertNotEqual(status, 200)
        XCTAssertEqual(try server.count("token_requests"), requestsBefore, "the bound refresh token was not presented")
        XCTAssertTrue(waitUntil(timeout: 10) { second.stderrText.contains("bound to another DPoP key") }, second.stderrText)
        XCTAssertEqual(try server.count("refresh_token_reuse"), 0)
    }

    /// Bearer answers keep working with dpop configured: no proof goes upstream then. And a DPoP answer without
    /// `dpop` is refused with a message naming the missing block.
    func testADPoPAnswerWithoutTheDPoPBlockNamesIt() throws {
        try startServer(["token_nonce": false, "api_nonce": false, "require_proof": false])
        let directory = workDir.appendingPathComponent("plain")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let config: [String: Any] = [
            "listen": "127.0.0.1:0", "upstream": ["url": server.apiURL], "tokens": ["file": tokenFileURL.path],
            "refresh": ["token_url": server.tokenURL, "client_id": "relay-client", "grant": "refresh_token", "client_auth": "none", "backoff_seconds": 0.05],
            "admin": ["listen": "127.0.0.1:0"],
        ]
        let relay = try TokenRelayProcess.start(config: config, workDir: directory)
        relays.append(relay)
        _ = load(relay, count: 1, concurrency: 1)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("add a \\\"dpop\\\" block") || relay.stderrText.contains("add a \"dpop\" block") },
                      relay.stderrText)
    }
}
