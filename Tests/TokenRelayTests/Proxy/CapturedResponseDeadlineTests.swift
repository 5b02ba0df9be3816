import Foundation
import XCTest
@testable import TokenRelay

/// A 401 is read to its end before the refresh rules decide, and its body is only needed if the refresh
/// fails. Found by the black-box probe: an upstream that sent a 401 head and then dripped its body a byte
/// at a time (never silent, so never cut by `stream_idle_seconds`) kept the request from being held and
/// replayed for as long as the drip lasted. Now the body gets `timeouts.upstream_seconds` from the head;
/// then the connection is closed and the refresh rules decide with what was read.
final class CapturedResponseDeadlineTests: RelayTestCase {
    private let settings = RequestLifecycle.Settings(idempotent: true, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5)
    private let token1 = RequestLifecycle.Admission.send(generation: 1, authorization: "Bearer one")

    func testTheMachineStopsReadingA401AfterTheUpstreamDeadlineAndDecides() {
        var machine = RequestLifecycle(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        let head = machine.responseHead(status: 401, indicatesExpiredToken: true)
        XCTAssertTrue(head.contains(.schedule(.responseHead, after: 30)), "the 401's body has a deadline: \(head)")
        XCTAssertEqual(head.last, .captureResponse)
        XCTAssertEqual(machine.timerFired(.responseHead, now: 30), [.cancelUpstream, .consultRefreshRules(sentGeneration: 1)])
        XCTAssertEqual(machine.refreshRulesDecided(.hold, now: 30), [.hold, .schedule(.hold, after: 10)])
    }

    func testA401ThatEndsInTimeCancelsItsDeadline() {
        var machine = RequestLifecycle(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        _ = machine.responseHead(status: 401, indicatesExpiredToken: true)
        XCTAssertEqual(machine.responseEnded(now: 1), [.cancel(.responseHead), .releaseConnection, .consultRefreshRules(sentGeneration: 1)])
    }

    func testARequestWhose401DripsIsStillRefreshedAndReplayed() throws {
        let upstream = try rawUpstream { [tokenServer] connection in
            while let request = try connection.readRequest() {
                let token = request.header("Authorization").map { String($0.dropFirst("Bearer ".count)) } ?? ""
                if tokenServer!.isAccessTokenValid(token) {
                    try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                }
                try connection.write("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: 1000\r\n\r\n")
                for _ in 0..<200 {
                    try connection.write("x")
                    Thread.sleep(forTimeInterval: 0.1)  // the upstream's pacing: 20 s for the body
                }
                return
            }
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL], "timeouts": ["upstream_seconds": 1]])
        tokenServer.expireAccessTokens()
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/drip", timeout: 8)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
    }
}
