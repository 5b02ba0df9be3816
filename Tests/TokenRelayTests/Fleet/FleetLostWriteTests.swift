import Foundation
import XCTest

/// A write Redis lost (an unreplicated write gone with a failed master, here: the hash set back to the
/// previous version by hand): a relay that wrote or adopted the newer version writes it back with the
/// compare-and-set before anyone refreshes, so no relay presents the refresh token that rotation burnt.
final class FleetLostWriteTests: FleetTestCase {
    func testALowerStoredVersionGetsTheNewerSetWrittenBackBeforeAnyRefresh() throws {
        try importTokens()
        let relays = try startFleet(2)
        let before = try redis.cli(["HGET", key, "tokens"])
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[0], "/rotate").status, 200)
        XCTAssertEqual(try storedVersion(), 2)
        let rotated = try redis.cli(["HGET", key, "tokens"])
        XCTAssertNotEqual(rotated, before)
        XCTAssertTrue(waitUntil(timeout: 5) { relays.allSatisfy { (try? self.status($0)["token_store"] as? [String: Any])?["version"] as? Int == 2 } },
                      "both relays hold version 2")

        // The failover's loss: Redis holds version 1 and its (burnt) refresh token again.
        try redis.cli(["HSET", key, "version", "1", "tokens", before])
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.storedVersion()) == 2 && (try? self.redis.cli(["HGET", self.key, "tokens"])) == rotated },
                      "the newer set is written back: \(relays[0].stderrText.suffix(1500))")
        let putBack = try relays.map { try metric($0, "tokenrelay_token_store_writes_put_back_total") }.reduce(0, +)
        XCTAssertEqual(putBack, 1, "one relay wins the compare-and-set; the other finds version 2 and has nothing to do")
        XCTAssertTrue(relays.contains { $0.stderrText.contains("put a token set lost by Redis back") })

        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[1], "/after").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 2)
        XCTAssertEqual(tokenServer.reuseDetections, 0, "the burnt refresh token was never presented")
    }

    /// An operator's import after a flush is a lower version too, but not a lost write: the import stamps the
    /// record (`imported_at`), and the relays adopt it instead of putting their older set back over it.
    func testAnImportAfterAFlushIsAdoptedNotOverwritten() throws {
        try importTokens()
        let relays = try startFleet(2)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[0], "/rotate").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { relays.allSatisfy { (try? self.status($0)["token_store"] as? [String: Any])?["version"] as? Int == 2 } },
                      "both relays hold version 2")

        try redis.cli(["FLUSHDB"])
        let fresh = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: fresh.access, refresh: fresh.refresh)
        try importTokens(expectingVersion: 1)
        XCTAssertTrue(waitUntil(timeout: 5) { relays.allSatisfy { $0.stderrText.contains("an operator's import replaced the token set this relay held") } },
                      "both relays follow the import: \(relays[0].stderrText.suffix(1500))")
        XCTAssertTrue(waitUntil(timeout: 5) { relays.allSatisfy { (try? self.status($0)["token_store"] as? [String: Any])?["version"] as? Int == 1 } })
        XCTAssertEqual(try storedVersion(), 1, "nothing was put back over the import")
        XCTAssertTrue(try redis.cli(["HGET", key, "tokens"]).contains(fresh.refresh))
        XCTAssertEqual(try relays.map { try metric($0, "tokenrelay_token_store_writes_put_back_total") }.reduce(0, +), 0)
        for relay in relays { XCTAssertEqual(try get(relay, "/after-import").status, 200) }
        XCTAssertEqual(api.requests.last?.header("Authorization"), "Bearer \(fresh.access)")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    private func metric(_ relay: TokenRelayProcess, _ name: String) throws -> Int {
        let line = try admin(relay, "/metrics").bodyText.split(separator: "\n").first { $0.hasPrefix(name + " ") }
        return line.flatMap { Double($0.split(separator: " ").last ?? "") }.map { Int($0) } ?? 0
    }

    /// The in-flight record: in Redis before the refresh token leaves, naming it by fingerprint only, and
    /// gone once the answer is stored.
    func testTheInFlightRecordIsInRedisWhileTheRefreshTokenIsAtTheServer() throws {
        try importTokens()
        let relay = try startFleet(1)[0]
        let presented = try XCTUnwrap(tokenServer.currentRefreshToken)
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let request = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/gated") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls == 1 })
        let record = try redis.cli(["GET", key + ":inflight"])
        XCTAssertFalse(record.isEmpty, "written before the refresh token left")
        XCTAssertFalse(record.contains(presented), "a fingerprint, never the token")
        tokenServer.openGate()
        XCTAssertEqual(try request.wait(timeout: 10).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.redis.cli(["EXISTS", self.key + ":inflight"])) == "0" }, "removed once the answer is stored")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}
