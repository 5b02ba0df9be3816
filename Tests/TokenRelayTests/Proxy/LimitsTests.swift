import Foundation
import XCTest

/// Every bounded resource answers with an error at its bound instead of growing.
final class LimitsTests: RelayTestCase {
    private func status(_ relay: TokenRelayProcess) -> [String: Any] {
        (try? admin(relay, "/status"))?.json() ?? [:]
    }

    func testUpstreamPoolWaitQueueIsBoundedAndTimed() throws {
        api.responseDelay = 2
        let relay = try startRelay(["limits": ["max_upstream_connections": 1, "max_upstream_waiters": 1],
                                    "timeouts": ["pool_wait_seconds": 0.3]])
        let port = relay.proxyPort
        let inFlight = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: port, method: "GET", path: "/slow") }
        XCTAssertTrue(waitUntil(timeout: 5) { api.requestCount == 1 })
        let waiting = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: port, method: "GET", path: "/waits") }
        XCTAssertTrue(waitUntil(timeout: 5) { status(relay)["upstream_waiters"] as? Int == 1 })

        let refused = try get(relay, "/refused")
        XCTAssertEqual(refused.status, 503, "beyond the wait queue: refused at once")
        XCTAssertEqual(refused.json()?["error"] as? String, "overloaded")

        let timedOut = try waiting.wait(timeout: 5)
        XCTAssertEqual(timedOut.status, 503, "waited longer than pool_wait_seconds")
        XCTAssertTrue(timedOut.bodyText.contains("timed out waiting for a free upstream connection"), timedOut.bodyText)
        XCTAssertEqual(try inFlight.wait(timeout: 10).status, 200)
        XCTAssertEqual(api.requests.map(\.path), ["/slow"], "refused requests never reach the upstream")
    }

    func testHeldRequestsAreBounded() throws {
        let relay = try startRelay(["limits": ["max_held_requests": 1], "refresh": ["max_attempts": 20, "backoff_seconds": 0.2]])
        tokenServer.failureMode = .unavailable(status: 503)
        tokenServer.expireAccessTokens()
        let port = relay.proxyPort
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: port, method: "GET", path: "/held") }
        XCTAssertTrue(waitUntil(timeout: 5) { (try? admin(relay, "/metrics"))?.bodyText.contains("tokenrelay_held_requests 1") ?? false })
        let refused = try get(relay, "/second")
        XCTAssertEqual(refused.status, 503)
        XCTAssertTrue(refused.bodyText.contains("too many requests are waiting for a token refresh"), refused.bodyText)
        tokenServer.failureMode = .normal
        XCTAssertEqual(try held.wait(timeout: 10).status, 200)
    }

    func testOversizedHeaderIsRefusedByTheListener() throws {
        let relay = try startRelay(["limits": ["max_header_bytes": 1024]])
        let request = "GET /big-header HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: \(String(repeating: "a", count: 4096))\r\n\r\n"
        let text = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(request.utf8)), as: UTF8.self)
        // evhttp 2.1 has no 431: an over-long header line is a 400 (observed), an over-long block a 413.
        let status = text.split(separator: " ").dropFirst().first.map(String.init) ?? "closed"
        XCTAssertTrue(["400", "413", "431"].contains(status) || text.isEmpty, String(text.prefix(200)))
        XCTAssertEqual(api.requestCount, 0)
        XCTAssertEqual(try get(relay).status, 200, "normal requests are still served")
    }
}
