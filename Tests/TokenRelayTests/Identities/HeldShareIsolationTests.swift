import Foundation
import XCTest

/// Held-request shares without any `routes[].max_held_requests`: the top-level route (its identity's token
/// endpoint hanging) floods past `limits.max_held_requests`, and route `b`, on its own identity and token
/// server, still has slots when its token dies at that moment.
final class HeldShareIsolationTests: SecondIdentityTestCase {
    /// Global limit 4, no route sets its own: the top-level route and b get 2 each. Without the shares the
    /// top-level flood takes all 4 slots and b's requests are refused although b's refresh works.
    private func settings(global: Int, routes extra: [[String: Any]] = []) -> [String: Any] {
        ["limits": ["max_held_requests": global],
         "routes": [["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "b"]] + extra,
         "identities": ["b": [
            "tokens": ["file": tokenFileB.path],
            "refresh": ["grant": "refresh_token", "token_url": tokenServerB.tokenURL, "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
         ]]]
    }

    func testARefreshStormOnOneRouteLeavesAnotherRouteItsShareOfHeldSlots() throws {
        let relay = try startRelay(settings(global: 4))
        XCTAssertEqual(try get(relay, "/a/warm").status, 200)
        XCTAssertEqual(try get(relay, "/b/warm").status, 200)
        let port = relay.proxyPort
        // The top-level identity's token endpoint hangs while its token is dead: a burst of 6 (more than the
        // global limit) has 2 held (its share) and 4 refused at once.
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let flood = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(6) { index in try HTTPTestClient.send(port: port, method: "GET", path: "/a/\(index)").status }
        }
        XCTAssertTrue(waitUntil(timeout: 10) { self.heldRequests(relay) == 2 }, "the top-level route holds its share")
        XCTAssertEqual(try get(relay, "/a/more").status, 503, "the top-level route is at its share")
        XCTAssertEqual(routeHolds(relay), ["default": [2, 2], "b": [0, 2]])
        // b's token dies too; its refresh is kept in flight so its held requests can be counted.
        tokenServerB.failureMode = .gated
        tokenServerB.expireAccessTokens()
        let others = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(2) { index in try HTTPTestClient.send(port: port, method: "GET", path: "/b/item/\(index)").status }
        }
        XCTAssertTrue(waitUntil(timeout: 10) { self.heldRequests(relay) == 4 }, "b's requests are held beside the flood")
        tokenServerB.openGate()
        let otherStatuses = try others.wait(timeout: 30).map { (try? $0.get()) ?? -1 }
        XCTAssertEqual(otherStatuses, [200, 200], "b: held and replayed while the top-level refresh still hangs")
        XCTAssertEqual(tokenServerB.successfulRefreshes, 1)
        XCTAssertEqual(heldRequests(relay), 2, "the flood is still held")
        XCTAssertEqual(tokenServer.successfulRefreshes, 0)
        tokenServer.openGate()
        let floodStatuses = try flood.wait(timeout: 30).map { (try? $0.get()) ?? -1 }
        XCTAssertEqual(floodStatuses.sorted(), [200, 200, 503, 503, 503, 503], "two held and replayed, the rest over the share")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections + tokenServerB.reuseDetections, 0)
        XCTAssertEqual(Set(apiB.requests.map(\.target).filter { $0.hasPrefix("/item/") }).count, 2)
    }

    /// /status shows each route's share; a reload recomputes them from the new config, and explicit values
    /// adding up past the global limit are kept with a warning line.
    func testAReloadRecomputesTheShares() throws {
        let relay = try startRelay(settings(global: 4))
        XCTAssertEqual(routeHolds(relay), ["default": [0, 2], "b": [0, 2]])
        let c: [String: Any] = ["name": "c", "match": ["path_prefix": "/c/"], "upstream": ["url": api.baseURL]]
        try reload(relay, settings(global: 9, routes: [c]))
        XCTAssertEqual(routeHolds(relay), ["default": [0, 3], "b": [0, 3], "c": [0, 3]])
        var explicit = c
        explicit["max_held_requests"] = 12
        try reload(relay, settings(global: 9, routes: [explicit]))
        XCTAssertEqual(routeHolds(relay), ["default": [0, 1], "b": [0, 1], "c": [0, 12]])
        XCTAssertTrue(relay.stderrText.contains("routes[].max_held_requests add up to 12, more than limits.max_held_requests (9)"), relay.stderrText)
        XCTAssertEqual(try get(relay, "/c/x").status, 200)
    }

    /// /status `routes`: each route's [held requests, share].
    private func routeHolds(_ relay: TokenRelayProcess) -> [String: [Int]] {
        guard let body = try? admin(relay, "/status").body,
              let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
              let routes = object["routes"] as? [String: [String: Any]] else { return [:] }
        return routes.mapValues { [($0["held_requests"] as? Int) ?? -1, ($0["max_held_requests"] as? Int) ?? -1] }
    }

    private func heldRequests(_ relay: TokenRelayProcess) -> Int {
        guard let body = try? admin(relay, "/status").body,
              let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return -1 }
        return (object["held_requests"] as? Int) ?? -1
    }
}
