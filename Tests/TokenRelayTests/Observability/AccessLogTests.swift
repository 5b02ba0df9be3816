import Foundation
import XCTest

final class AccessLogTests: RelayTestCase {
    func testAccessLogLinePerRequestWithoutQuery() throws {
        let relay = try startRelay(["log": ["access": true]])
        XCTAssertEqual(try get(relay, "/orders/7?api_key=canary-query-value").status, 200)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/after-expiry").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("path=/after-expiry") })
        let lines = relay.stderrText.split(separator: "\n").filter { $0.contains("msg=request ") }
        XCTAssertEqual(lines.count, 2, relay.stderrText)
        XCTAssertTrue(lines[0].contains("method=GET") && lines[0].contains("path=/orders/7 ") && lines[0].contains("status=200"), String(lines[0]))
        XCTAssertTrue(lines[1].contains("attempts=2"), "the replayed request was sent twice: \(lines[1])")
        XCTAssertFalse(relay.stderrText.contains("canary-query-value"))

        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_upstream_response_seconds_count 3"), metrics)
        XCTAssertTrue(metrics.contains("tokenrelay_hold_duration_seconds_count{outcome=\"replayed\"} 1"), metrics)
    }

    func testAQueryIsLoggedOnlyWhenAskedAndWithoutCredentials() throws {
        let relay = try startRelay(["log": ["access": true, "access_query": true]])
        XCTAssertEqual(try get(relay, "/orders/7?page=2&access_token=canary-token-value").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("path=\"/orders/7?page=2&access_token=[redacted]\"")
            || relay.stderrText.contains("path=/orders/7?page=2&access_token=[redacted]") }, relay.stderrText)
        XCTAssertFalse(relay.stderrText.contains("canary-token-value"))
    }

    func testAccessLogIsOffByDefault() throws {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertFalse(relay.stderrText.contains("msg=request "))
    }
}
