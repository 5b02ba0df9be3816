import Foundation
import XCTest

/// `POST /refresh` used to rotate the refresh token once per call (30 calls, 30 rotations). Calls made
/// while a refresh runs join it; calls within a few seconds after one get its result.
final class AdminRefreshGuardTests: RelayTestCase {
    func testThirtyForcedRefreshesRotateAtMostTwice() throws {
        let relay = try startRelay()
        let together = burst(15) { _ in try HTTPTestClient.send(port: relay.adminPort, method: "POST", path: "/refresh") }
        XCTAssertEqual(together.map(\.status), Array(repeating: 200, count: 15))
        for _ in 0..<15 {
            XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        }
        XCTAssertGreaterThanOrEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertLessThanOrEqual(tokenServer.successfulRefreshes, 2, "30 calls, at most a couple of rotations")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}
