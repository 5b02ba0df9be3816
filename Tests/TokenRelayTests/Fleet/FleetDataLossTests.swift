import Foundation
import XCTest

/// Redis loses its data (restarted without persistence, or flushed) while one relay's refresh is at the
/// token server. The lock went with the data, so it no longer tells the fleet that a refresh is in
/// progress. Found by the black-box probe: another relay that needed a token took a fresh lock, found no
/// token set and presented the same refresh token; the rotation server saw reuse, revoked the session,
/// and the whole fleet latched "login required".
final class FleetDataLossTests: FleetTestCase {
    func testARelayDoesNotPresentTheRefreshTokenWhileARefreshBegunBeforeTheLossMayBeInProgress() throws {
        try importTokens()
        let relays = try startFleet(2, ["lock_seconds": 8])
        tokenServer.failureMode = .gated
        defer { tokenServer.openGate() }
        tokenServer.expireAccessTokens()
        let first = HTTPTestClient.concurrentlyAsync {
            try HTTPTestClient.send(port: relays[0].proxyPort, method: "GET", path: "/first", timeout: 20)
        }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls == 1 }, "the first relay's refresh reached the token server")
        _ = try redis.cli(["FLUSHALL"])

        let second = HTTPTestClient.concurrentlyAsync {
            try HTTPTestClient.send(port: relays[1].proxyPort, method: "GET", path: "/second", timeout: 20)
        }
        XCTAssertTrue(waitUntil(timeout: 10) { relays[1].stderrText.contains("lost its data") },
                      "the second relay noticed the loss: \(relays[1].stderrText.suffix(1500))")
        XCTAssertEqual(tokenServer.refreshCalls, 1, "the refresh token was presented again while the first refresh was in progress")

        tokenServer.openGate()
        XCTAssertEqual(try first.wait(timeout: 20).status, 200)
        XCTAssertEqual(try second.wait(timeout: 20).status, 200, "the second relay adopted the first one's tokens")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertFalse(tokenServer.isCurrentFamilyRevoked)
    }
}
