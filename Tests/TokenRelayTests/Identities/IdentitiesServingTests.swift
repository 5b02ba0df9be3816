import Foundation
import XCTest

/// Two identities, each with its own token server (rotation and reuse detection) and API: the top-level
/// one behind the default route, `b` behind `/b/`. Whatever happens to one identity's tokens, the other's
/// requests, refreshes and readiness do not notice.
final class IdentitiesServingTests: SecondIdentityTestCase {
    private var twoIdentities: [String: Any] {
        ["routes": [["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "b"]],
         "identities": ["b": [
            "tokens": ["file": tokenFileB.path, "watch_interval_seconds": 0.2],
            "refresh": ["grant": "refresh_token", "token_url": tokenServerB.tokenURL, "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic", "backoff_seconds": 0.05],
         ]]]
    }

    private func burst(_ relay: TokenRelayProcess, count: Int) -> [Int] {
        let port = relay.proxyPort
        return HTTPTestClient.concurrently(count) { index in
            try HTTPTestClient.send(port: port, method: "GET", path: index.isMultiple(of: 2) ? "/b/item/\(index)" : "/a/item/\(index)").status
        }.map { (try? $0.get()) ?? -1 }
    }

    private func admin(_ relay: TokenRelayProcess, _ method: String, _ path: String) throws -> (status: Int, json: [String: Any]) {
        let response = try HTTPTestClient.send(port: relay.adminPort, method: method, path: path)
        return (response.status, (try JSONSerialization.jsonObject(with: response.body) as? [String: Any]) ?? [:])
    }

    func testBurstOnBothRoutesAfterBothTokensDiedRefreshesOncePerIdentity() throws {
        let relay = try startRelay(twoIdentities)
        XCTAssertEqual(burst(relay, count: 2), [200, 200])
        tokenServer.expireAccessTokens()
        tokenServerB.expireAccessTokens()
        XCTAssertEqual(burst(relay, count: 40), Array(repeating: 200, count: 40))
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections + tokenServerB.reuseDetections, 0)
        XCTAssertEqual(Set(apiB.requests.map(\.target).filter { $0.hasPrefix("/item/") }).count, 20, "b's requests reached b's API, stripped")
        // Each identity's rotation went to its own file.
        XCTAssertTrue(waitUntil(timeout: 5) {
            (try? String(contentsOf: self.tokenFileB, encoding: .utf8))?.contains(self.tokenServerB.currentRefreshToken ?? "?") ?? false
        })
        XCTAssertTrue(waitUntil(timeout: 5) {
            (try? String(contentsOf: self.tokenFileURL, encoding: .utf8))?.contains(self.tokenServer.currentRefreshToken ?? "?") ?? false
        })
    }

    /// A route's answers are judged by its identity's `refresh.trigger_statuses` (and `trigger_grpc_statuses`),
    /// not the top level's: b counts 419, the top level does not.
    func testAnIdentitysOwnTriggerStatusesApplyToItsRoute() throws {
        var config = twoIdentities
        var identities = config["identities"] as! [String: [String: Any]]
        var refresh = identities["b"]!["refresh"] as! [String: Any]
        refresh["trigger_statuses"] = [419]
        identities["b"]!["refresh"] = refresh
        config["identities"] = identities
        let relay = try startRelay(config)
        let servedB = Locked(0), servedA = Locked(0)
        apiB.responseOverride = { _ in servedB.withLock { $0 += 1; return $0 } == 1 ? TestResponse(status: 419) : nil }
        api.responseOverride = { _ in servedA.withLock { $0 += 1; return $0 } == 1 ? TestResponse(status: 419) : nil }
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/item").status, 200, "b's 419 is refreshed and replayed")
        XCTAssertEqual(tokenServerB.successfulRefreshes, 1)
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/a/item").status, 419, "the top level does not count 419")
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }

    func testOneTokenServerDownLeavesTheOtherRouteServing() throws {
        let relay = try startRelay(twoIdentities)
        tokenServerB.stop()
        tokenServerB.expireAccessTokens()
        tokenServer.expireAccessTokens()
        let statuses = burst(relay, count: 20)
        XCTAssertEqual(statuses.enumerated().filter { !$0.offset.isMultiple(of: 2) }.map(\.element), Array(repeating: 200, count: 10),
                       "the top-level identity refreshes and serves")
        XCTAssertFalse(statuses.enumerated().filter { $0.offset.isMultiple(of: 2) }.map(\.element).contains(200), "b cannot refresh: \(statuses)")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        let ready = try admin(relay, "GET", "/readyz")
        XCTAssertEqual(ready.status, 503)
        XCTAssertTrue((ready.json["reason"] as? String)?.hasPrefix("identity b:") ?? false, "\(ready.json)")
        XCTAssertEqual((ready.json["identities"] as? [String: Any]).flatMap { $0["b"] as? [String: Any] }?["ready"] as? Bool, false)
    }

    func testLoginRequiredOnOneIdentityIsNamedByReadyzWhileTheOtherServes() throws {
        let relay = try startRelay(twoIdentities)
        tokenServerB.failureMode = .rejectAll
        tokenServerB.expireAccessTokens()
        XCTAssertNotEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/x").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { ((try? self.admin(relay, "GET", "/readyz/b"))?.json["state"] as? String) == "login_required" })
        let all = try admin(relay, "GET", "/readyz")
        XCTAssertEqual(all.status, 503)
        XCTAssertEqual(all.json["reason"] as? String, "identity b: login required")
        XCTAssertEqual(try admin(relay, "GET", "/readyz?identity=b").status, 503)
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/a/still").status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 0, "the top-level identity was never asked to refresh")
        let status = try admin(relay, "GET", "/status")
        let identities = try XCTUnwrap(status.json["identities"] as? [String: Any])
        XCTAssertEqual((identities["b"] as? [String: Any])?["state"] as? String, "login_required")
        XCTAssertEqual(status.json["ready"] as? Bool, false)
        XCTAssertFalse(relay.stderrText.contains(tokenServerB.currentRefreshToken ?? "?"), "no token in the log")
        let metrics = String(decoding: try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").body, as: UTF8.self)
        XCTAssertTrue(metrics.contains(#"tokenrelay_login_required{identity="b"} 1"#), metrics)
        XCTAssertTrue(metrics.contains(#"tokenrelay_login_required{identity="default"} 0"#), metrics)
        XCTAssertTrue(metrics.contains(#"tokenrelay_refresh_errors_total{error="invalid_grant",identity="b"}"#)
                      || metrics.contains(#"tokenrelay_refresh_errors_total{identity="b",error="invalid_grant"}"#), metrics)
        XCTAssertFalse(metrics.contains(tokenServerB.currentAccessToken ?? "?"), "no token in the metrics")
    }

    func testAdminAddressesOneIdentity() throws {
        let relay = try startRelay(twoIdentities)
        XCTAssertEqual(try admin(relay, "GET", "/readyz/b").status, 200)
        XCTAssertEqual(try admin(relay, "GET", "/readyz/nobody").status, 404)
        let refreshed = try admin(relay, "POST", "/refresh?identity=b")
        XCTAssertEqual(refreshed.status, 200, "\(refreshed.json)")
        XCTAssertEqual(tokenServerB.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.successfulRefreshes, 0)
        XCTAssertEqual(try admin(relay, "POST", "/refresh").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(try admin(relay, "GET", "/readyz").status, 200)
    }

    /// A reload adding identity `c` (a second token family of b's server) with its route, under load on
    /// the others: no client error, and `c` serves right after.
    func testReloadAddsAnIdentityAndItsRoute() throws {
        let relay = try startRelay(twoIdentities)
        let familyC = tokenServerB.issueInitialTokens()
        let tokenFileC = workDir.appendingPathComponent("tokens-c.json")
        try writeTokenFile(at: tokenFileC, access: familyC.access, refresh: familyC.refresh)
        var next = twoIdentities
        next["routes"] = (next["routes"] as! [[String: Any]])
            + [["name": "c", "match": ["path_prefix": "/c/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "c"]]
        var identities = next["identities"] as! [String: Any]
        identities["c"] = ["tokens": ["file": tokenFileC.path],
                           "refresh": ["grant": "refresh_token", "token_url": tokenServerB.tokenURL, "client_id": "legacy-app",
                                       "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"]]
        next["identities"] = identities
        let port = relay.proxyPort
        let reloaded = Locked(false)
        let load = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(4) { index -> [Int] in
                var statuses: [Int] = [], afterReload = 0
                for step in 0..<2000 where afterReload < 20 {
                    let path = index.isMultiple(of: 2) ? "/b/load/\(step)" : "/a/load/\(step)"
                    statuses.append(try HTTPTestClient.send(port: port, method: "GET", path: path).status)
                    if reloaded.withLock({ $0 }) { afterReload += 1 }
                }
                return statuses
            }
        }
        try reload(relay, next)
        reloaded.withLock { $0 = true }
        XCTAssertTrue(relay.stderrText.contains("identity added by a config reload"), relay.stderrText)
        XCTAssertEqual(try HTTPTestClient.send(port: port, method: "GET", path: "/c/after").status, 200)
        XCTAssertEqual(apiB.requests.last { $0.target == "/after" }?.header("authorization"), "Bearer \(familyC.access)", "c's own token")
        let statuses = try load.wait(timeout: 120).flatMap { (try? $0.get()) ?? [-1] }
        XCTAssertEqual(Set(statuses), [200])
        XCTAssertEqual(try admin(relay, "GET", "/readyz/c").status, 200)
    }

    /// A reload removing b while one of b's requests is held for a refresh in flight: the held request is
    /// answered 503 at once, the refresh still finishes and is saved (never lost, never presented again).
    func testReloadRemovingAnIdentityAnswersItsHeldRequests() throws {
        let relay = try startRelay(twoIdentities)
        tokenServerB.failureMode = .gated
        tokenServerB.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/held").status }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServerB.refreshCalls == 1 })
        var next = config()
        next["log"] = ["level": "debug"]
        try reload(relay, next)
        XCTAssertEqual(try held.wait(timeout: 10), 503)
        XCTAssertTrue(relay.stderrText.contains("identity removed by a config reload"), relay.stderrText)
        tokenServerB.openGate()
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServerB.successfulRefreshes == 1 })
        XCTAssertTrue(waitUntil(timeout: 5) {
            (try? String(contentsOf: self.tokenFileB, encoding: .utf8))?.contains(self.tokenServerB.currentRefreshToken ?? "?") ?? false
        }, "the removed identity's rotated tokens are still saved")
        // /b/ now belongs to no route: the top-level upstream answers it (with the top-level token).
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/after").status, 200)
        XCTAssertEqual(api.requests.last?.target, "/b/after")
        XCTAssertEqual(try admin(relay, "GET", "/readyz/b").status, 404)
        XCTAssertEqual(tokenServerB.reuseDetections, 0)
    }

    /// A reload that leaves b's token settings alone keeps its machine: a refresh in flight across the
    /// reload releases b's held requests with 200, and it stays the only one.
    func testReloadKeepingAnIdentityKeepsItsRefreshInFlight() throws {
        let relay = try startRelay(twoIdentities)
        tokenServerB.failureMode = .gated
        tokenServerB.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/b/held").status }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServerB.refreshCalls == 1 })
        var next = twoIdentities
        var identities = next["identities"] as! [String: Any]
        var b = identities["b"] as! [String: Any]
        var refresh = b["refresh"] as! [String: Any]
        refresh["max_attempts"] = 3
        b["refresh"] = refresh
        identities["b"] = b
        next["identities"] = identities
        try reload(relay, next)
        tokenServerB.openGate()
        XCTAssertEqual(try held.wait(timeout: 10), 200)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 1)
        XCTAssertEqual(tokenServerB.reuseDetections, 0)
        XCTAssertFalse(relay.stderrText.contains("identity added"), "b was kept, not made again")
    }
}
