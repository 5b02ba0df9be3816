import Foundation
import XCTest

/// `tokens.redis.wait_replicas`: with a replica attached the write counts once the replica has it; with
/// none in time the write has not landed: the held requests stay held (their hold timeout answers 503),
/// the log says why, and the write goes again until a replica acknowledges it; no reuse.
final class FleetReplicaWaitTests: FleetTestCase {
    override var redisListensOnTCP: Bool { true }

    func testHeldRequestsWaitForTheConfiguredReplicas() throws {
        try importTokens()
        let replica = try RedisServerProcess()
        defer { replica.stop() }
        try replica.cli(["REPLICAOF", "127.0.0.1", String(try XCTUnwrap(redis.tcpPort))])
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? self.redis.cli(["INFO", "replication"])) ?? "").contains("connected_slaves:1") })
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? replica.cli(["INFO", "replication"])) ?? "").contains("master_link_status:up") })
        var config = fleetConfig(["wait_replicas": 1])
        config["timeouts"] = ["refresh_seconds": 2, "hold_seconds": 2]
        let relay = try startRelay(config)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/with-replica").status, 200)
        XCTAssertEqual(try statusField(relay, "unsaved_tokens") as? Bool, false, "the replica acknowledged")
        XCTAssertEqual(try replica.cli(["HGET", key, "version"]), "2", "the replica has the new version")

        replica.stop()
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? self.redis.cli(["INFO", "replication"])) ?? "").contains("connected_slaves:0") })
        tokenServer.expireAccessTokens()
        let held = try get(relay, "/no-replica")
        XCTAssertEqual(held.status, 503, "no replica has the new tokens: the request is not released with them")
        XCTAssertNotNil(held.header("Retry-After"), "503 with Retry-After")
        XCTAssertEqual(try statusField(relay, "unsaved_tokens") as? Bool, true, "no replica acknowledged: the write has not landed")
        XCTAssertTrue(relay.stderrText.contains("replicas acknowledged"), relay.stderrText.suffix(2000).description)
        XCTAssertTrue(relay.stderrText.contains("held requests wait until the shared token store acknowledges"), relay.stderrText.suffix(2000).description)

        let second = try RedisServerProcess()
        defer { second.stop() }
        try second.cli(["REPLICAOF", "127.0.0.1", String(try XCTUnwrap(redis.tcpPort))])
        XCTAssertTrue(waitUntil(timeout: 15) { (try? self.statusField(relay, "unsaved_tokens") as? Bool) == false }, "written again until acknowledged")
        XCTAssertEqual(try get(relay, "/after-replica").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 2, "one refresh per expiry; the retry wrote the same tokens")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    private func statusField(_ relay: TokenRelayProcess, _ field: String) throws -> Any? {
        try XCTUnwrap(JSONSerialization.jsonObject(with: admin(relay, "/status").body) as? [String: Any])[field]
    }
}
