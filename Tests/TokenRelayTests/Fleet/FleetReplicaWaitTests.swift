import Foundation
import XCTest

/// `tokens.redis.wait_replicas`: the refresh lock and the in-flight record are on the replicas before the
/// refresh token leaves (a failover cannot lose them and let a second relay present the same token), and
/// the new token set is on them before held requests are released with it. Too few replicas in time:
/// for the record, the refresh token is not presented (record removed, lock released, a transient store
/// failure); for the token set, the held requests stay held (their hold timeout answers 503) and the
/// write goes again until a replica acknowledges it. No reuse either way.
final class FleetReplicaWaitTests: FleetTestCase {
    override var redisListensOnTCP: Bool { true }

    func testHeldRequestsWaitForTheConfiguredReplicas() throws {
        try importTokens()
        let replica = try attachReplica()
        defer { replica.stop() }
        var config = fleetConfig(["wait_replicas": 1])
        config["timeouts"] = ["refresh_seconds": 4, "hold_seconds": 2]
        let relay = try startRelay(config)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })

        // The token server holds the request until the test has looked at the replica: the lock and the
        // record are there at the moment the refresh token is presented.
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let first = AsyncCall { [port = relay.proxyPort] in try HTTPTestClient.send(port: port, method: "GET", path: "/with-replica") }
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 1 }, "the refresh reached the token server")
        XCTAssertFalse(try replica.cli(["GET", "\(key):inflight"]).isEmpty, "the in-flight record was on the replica before the refresh token left")
        XCTAssertFalse(try replica.cli(["GET", "\(key):lock"]).isEmpty, "the lock was on the replica before the refresh token left")
        tokenServer.openGate()
        XCTAssertEqual(try first.wait(timeout: 10).status, 200)
        XCTAssertEqual(try statusField(relay, "unsaved_tokens") as? Bool, false, "the replica acknowledged")
        XCTAssertEqual(try replica.cli(["HGET", key, "version"]), "2", "the replica has the new version")

        // The replica goes while the next refresh is at the token server (its record was confirmed): the
        // token set's WAIT finds no replica.
        tokenServer.failureMode = .gated
        tokenServer.closeGate()
        tokenServer.expireAccessTokens()
        let pending = AsyncCall { [port = relay.proxyPort] in try HTTPTestClient.send(port: port, method: "GET", path: "/no-replica") }
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 2 }, "the second refresh reached the token server")
        replica.stop()
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? self.redis.cli(["INFO", "replication"])) ?? "").contains("connected_slaves:0") })
        tokenServer.openGate()
        let held = try pending.wait(timeout: 15)
        XCTAssertEqual(held.status, 503, "no replica has the new tokens: the request is not released with them")
        XCTAssertNotNil(held.header("Retry-After"), "503 with Retry-After")
        XCTAssertEqual(try statusField(relay, "unsaved_tokens") as? Bool, true, "no replica acknowledged: the write has not landed")
        XCTAssertTrue(relay.stderrText.contains("replicas acknowledged"), relay.stderrText.suffix(2000).description)
        XCTAssertTrue(relay.stderrText.contains("held requests wait until the shared token store acknowledges"), relay.stderrText.suffix(2000).description)

        let second = try attachReplica()
        defer { second.stop() }
        XCTAssertTrue(waitUntil(timeout: 15) { (try? self.statusField(relay, "unsaved_tokens") as? Bool) == false }, "written again until acknowledged")
        XCTAssertEqual(try get(relay, "/after-replica").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 2, "one refresh per expiry; the retry wrote the same tokens")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// The race it covers: the sentinels promote a replica that never got our lock and record, and a relay
    /// following the failover presents the same refresh token. Here no replica confirms: the token is not sent.
    func testRefreshTokenIsNotPresentedUntilReplicasConfirmTheLockAndRecord() throws {
        try importTokens()
        let replica = try attachReplica()
        var config = fleetConfig(["wait_replicas": 1])
        config["timeouts"] = ["refresh_seconds": 2, "hold_seconds": 2]
        let relay = try startRelay(config)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })
        replica.stop()
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? self.redis.cli(["INFO", "replication"])) ?? "").contains("connected_slaves:0") })

        tokenServer.expireAccessTokens()
        let held = try get(relay, "/no-replica")
        XCTAssertEqual(held.status, 503, "the refresh could not start: the store-unavailable answer")
        XCTAssertNotNil(held.header("Retry-After"), "503 with Retry-After")
        XCTAssertEqual(tokenServer.refreshCalls, 0, "the refresh token never left")
        XCTAssertTrue(relay.stderrText.contains("wait_replicas is 1 but 0 Redis replicas confirmed"), relay.stderrText.suffix(2000).description)
        XCTAssertTrue(relay.stderrText.contains("the refresh token was not sent"), relay.stderrText.suffix(2000).description)
        XCTAssertTrue(waitUntil(timeout: 10) {
            ((try? self.redis.cli(["EXISTS", "\(self.key):inflight", "\(self.key):lock"])) ?? "") == "0"
        }, "the unconfirmed in-flight record removed and the lock released")
        XCTAssertEqual(try redis.cli(["HGET", key, "version"]), "1", "nothing written")

        let second = try attachReplica()
        defer { second.stop() }
        XCTAssertTrue(waitUntil(timeout: 15) { (try? self.get(relay, "/with-replica").status) == 200 }, "refreshes once a replica confirms")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertFalse(relay.stderrText.contains(tokenServer.currentRefreshToken ?? "<none>"), "no token in the log")
    }

    private func attachReplica() throws -> RedisServerProcess {
        let replica = try RedisServerProcess()
        try replica.cli(["REPLICAOF", "127.0.0.1", String(try XCTUnwrap(redis.tcpPort))])
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? replica.cli(["INFO", "replication"])) ?? "").contains("master_link_status:up") })
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? self.redis.cli(["INFO", "replication"])) ?? "").contains("connected_slaves:1") })
        return replica
    }

    private func statusField(_ relay: TokenRelayProcess, _ field: String) throws -> Any? {
        try XCTUnwrap(JSONSerialization.jsonObject(with: admin(relay, "/status").body) as? [String: Any])[field]
    }
}
