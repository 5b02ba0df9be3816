import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Issue 24: a rotation Redis never acknowledged survives the refreshing relay's death in its local cache
/// (`tokens.file` beside `tokens.redis`), and is written back with the compare-and-set when the relay starts
/// again and Redis answers: the rest of the fleet never presents the refresh token that rotation burnt.
final class FleetCacheWriteBackTests: FleetTestCase {
    func testARotationRedisNeverAcknowledgedIsWrittenBackFromTheCacheAfterARestart() throws {
        try importTokens()
        let cachePath = workDir.appendingPathComponent("relay-a-cache.json").path
        let configA = try fleetConfig(cachingIn: cachePath)
        let relayA = try startRelay(configA)
        let relayB = try startRelay(fleetConfig())
        for relay in [relayA, relayB] {
            XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, relay.stderrText.suffix(1500).description)
        }

        // A's refresh reaches the token server; Redis stalls writes before the answer comes back, so A's
        // write is never acknowledged; A dies holding the only copy of the rotated set, in its cache.
        defer { _ = try? redis.cli(["CLIENT", "UNPAUSE"]) }
        let rotated = try rotateWhileRedisPausesWrites(through: relayA, cachePath: cachePath)
        relayA.signal(SIGKILL)
        XCTAssertNotNil(relayA.waitForExit(timeout: 5))
        try redis.cli(["CLIENT", "UNPAUSE"])
        XCTAssertEqual(try storedVersion(), 1, "Redis never got the rotation")

        let restarted = try restartAndAwaitWriteBack(configA, rotated: rotated)
        XCTAssertFalse(try redis.cli(["HGET", key, "tokens"]).contains("redis_write_unacknowledged"), "the mark stays in the cache")
        XCTAssertTrue(restarted.stderrText.contains("put a token set lost by Redis back"))

        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.status(relayB)["token_store"] as? [String: Any])?["version"] as? Int == 2 },
                      "B adopts the written-back set")
        XCTAssertEqual(try get(relayB, "/after").status, 200)
        XCTAssertEqual(try get(restarted, "/after").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "served with the rotated set, nothing presented again")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}
