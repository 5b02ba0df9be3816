import Foundation
import XCTest

/// The reason tokenrelay exists: many requests failing at once cause exactly one refresh.
final class CoalescedRefreshTests: RelayTestCase {
    func testFiftyConcurrentRequestsAfterExpiryCauseOneRefresh() throws {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 200)
        tokenServer.expireAccessTokens()

        let responses = burst(50) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/items/\(i)") }

        XCTAssertEqual(statusCounts(responses), [200: 50])
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertGreaterThan(api.unauthorizedCount, 0, "the burst must really have hit the expired token")
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_refreshes_total{outcome=\"success\"} 1"), metrics)
    }

    func testStaleGenerationUnauthorizedIsReplayedWithoutRefresh() throws {
        let relay = try startRelay()
        let slow = try requestSpanningARefresh(relay)
        XCTAssertEqual(tokenServer.refreshCalls, 1)

        let slowResponse = try slow.wait(timeout: 10)
        XCTAssertEqual(slowResponse.status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1, "a 401 for an older generation must not refresh again")
        let slowAttempts = api.requests.filter { $0.path == "/slow" }
        XCTAssertEqual(slowAttempts.count, 2)
        XCTAssertNotEqual(slowAttempts[0].bearerToken, slowAttempts[1].bearerToken)
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_replays_total{reason=\"stale_token\"} 1"), metrics)
    }

    func testLargeBodiesAreReplayedByteIdentical() throws {
        let relay = try startRelay()
        tokenServer.expireAccessTokens()
        let bodies = (0..<8).map { i in Data((0..<(64 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ i &* 7) }) }

        let responses = burst(8) { i in
            try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/echo",
                                    headers: [("Content-Type", "application/octet-stream")], body: bodies[i])
        }

        XCTAssertEqual(responses.count, 8)
        for response in responses { XCTAssertEqual(response.status, 200) }
        XCTAssertEqual(Set(responses.map(\.body)), Set(bodies), "every replayed body must arrive unchanged")
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        let replayed = api.requests.filter { $0.path == "/echo" && $0.bearerToken == tokenServer.currentAccessToken }
        XCTAssertEqual(replayed.count, 8)
        for request in replayed { XCTAssertEqual(request.header("Content-Length"), String(64 * 1024)) }
    }

    func testRequestsArrivingDuringARefreshAreHeldNotSent() throws {
        let relay = try startRelay()
        tokenServer.failureMode = .delay(0.8)
        tokenServer.expireAccessTokens()
        let first = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/first") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.receivedRequests.count == 1 })
        let sentBefore = api.requestCount

        let during = burst(10) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/during/\(i)") }

        XCTAssertEqual(statusCounts(during), [200: 10])
        XCTAssertEqual(try first.wait(timeout: 10).status, 200)
        let duringRequests = api.requests.filter { $0.path.hasPrefix("/during/") }
        XCTAssertEqual(duringRequests.count, 10, "held requests are sent once, after the refresh")
        XCTAssertEqual(sentBefore, 1)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }
}
