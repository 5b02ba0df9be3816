import Foundation
import XCTest

final class LifecycleTests: RelayTestCase {
    func testSigtermLetsInFlightRequestsFinishAndExitsZero() throws {
        let relay = try startRelay()
        api.responseDelay = 0.7
        let inFlight = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/slow") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.api.requestCount == 1 })
        relay.signal(SIGTERM)
        XCTAssertEqual(try inFlight.wait(timeout: 10).status, 200)
        XCTAssertEqual(relay.waitForExit(timeout: 10), 0)
        XCTAssertTrue(relay.stderrText.contains("shutting down"))
    }

    func testDrainTimeoutAnswersHeldRequests() throws {
        let relay = try startRelay(["timeouts": ["drain_seconds": 0.5, "hold_seconds": 30], "refresh": ["max_attempts": 20, "backoff_seconds": 0.2]])
        tokenServer.failureMode = .unavailable(status: 503)
        tokenServer.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/held") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls >= 1 })
        relay.signal(SIGTERM)
        XCTAssertEqual(try held.wait(timeout: 10).status, 503, "a held request is never dropped without an answer")
        XCTAssertEqual(relay.waitForExit(timeout: 10), 0)
    }

    func testClientHangingUpWhileHeldIsDroppedCleanly() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 1]])
        tokenServer.failureMode = .delay(1.0)
        tokenServer.expireAccessTokens()
        // The client sends, then vanishes while its request waits for the refresh.
        let connection = try HTTPTestConnection(port: relay.proxyPort)
        try connection.write(method: "GET", path: "/gone")
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.receivedRequests.count == 1 })
        connection.close()
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/status").json()?["active_requests"] as? Int) == 0 })
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes == 1 }, "the refresh is not cancelled with its client")
        let upstreamGone = api.requests.filter { $0.path == "/gone" }
        XCTAssertEqual(upstreamGone.count, 1, "nothing is replayed for a client that left")
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testSecondInstanceOnTheSameAddressFails() throws {
        let first = try startRelay()
        XCTAssertThrowsError(try startRelay(["listen": "127.0.0.1:\(first.proxyPort)"])) { error in
            XCTAssertTrue("\(error)".contains("cannot listen on 127.0.0.1:\(first.proxyPort)"), "\(error)")
        }
    }
}
