import Foundation
import XCTest

/// A `url` that leads to a node which is (or became) a replica: the store is unavailable with that
/// reason on /status and /readyz, noticed by `ROLE` (at connect and with every poll) or by a write
/// answered `READONLY`, and ready again by itself once the node is a master.
final class FleetReplicaRoleTests: FleetTestCase {
    /// The node the relay's `url` names is made a replica of this one (a master on a TCP port).
    private var newMaster: RedisServerProcess!

    override func setUpWithError() throws {
        try super.setUpWithError()
        newMaster = try RedisServerProcess(tcp: true)
    }

    override func tearDownWithError() throws {
        newMaster?.stop()
        newMaster = nil
        try super.tearDownWithError()
    }

    private func demote() throws {
        try redis.cli(["REPLICAOF", "127.0.0.1", String(try XCTUnwrap(newMaster.tcpPort))])
    }

    private func unreachableReason(_ relay: TokenRelayProcess) -> String {
        ((try? status(relay)["token_store"] as? [String: Any])?["unreachable_reason"] as? String) ?? ""
    }

    func testAURLAtANodeTurnedReplicaIsNotReadyAndSaysWhy() throws {
        try importTokens()
        let relay = try startFleet(1)[0]
        try demote()
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 503 }, "a replica is never healthy")
        XCTAssertTrue(unreachableReason(relay).contains("replica"), unreachableReason(relay))
        XCTAssertTrue(try admin(relay, "/readyz").bodyText.contains("replica"), "readiness says why")
        XCTAssertEqual(try get(relay, "/still-valid").status, 200, "as unreachable: a valid token keeps serving")
        let master = try XCTUnwrap((try status(relay)["token_store"] as? [String: Any])?["master"] as? [String: Any])
        XCTAssertEqual(master["found_by"] as? String, "url")
        XCTAssertEqual(master["address"] as? String, redis.url)
        XCTAssertNotNil(master["last_demotion_seen"] as? String, "when the node was found no master")

        try redis.cli(["REPLICAOF", "NO", "ONE"])
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, "ready again by itself")
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }

    func testARelayStartedOnAReplicaIsNotReady() throws {
        try importTokens()
        try demote()
        let relay = try startRelay(fleetConfig())
        XCTAssertTrue(waitUntil(timeout: 10) { self.unreachableReason(relay).contains("ROLE") }, relay.stderrText.suffix(2000).description)
        XCTAssertEqual(try admin(relay, "/readyz").status, 503)
    }

    /// Polls too rare to notice: the first write (the refresh lock's SET) is answered READONLY. Nothing
    /// is presented to the token server, the request gets a clean 503, and the reply is counted.
    func testAWriteAnsweredReadOnlyMakesTheStoreUnavailable() throws {
        try importTokens()
        var config = fleetConfig(["poll_interval_seconds": 60])
        config["timeouts"] = ["refresh_seconds": 2, "hold_seconds": 3]
        let relay = try startRelay(config)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })
        try demote()
        tokenServer.expireAccessTokens()
        let response = try get(relay, "/needs-refresh")
        XCTAssertEqual(response.status, 503, response.bodyText)
        XCTAssertNotNil(response.header("Retry-After"))
        XCTAssertTrue(unreachableReason(relay).contains("READONLY"), unreachableReason(relay))
        XCTAssertTrue(try admin(relay, "/metrics").bodyText.contains("tokenrelay_token_store_readonly_replies_total 1"))
        XCTAssertEqual(tokenServer.refreshCalls, 0, "no refresh token presented without a writable store")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}
