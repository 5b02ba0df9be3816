import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Issue 24, the graceful form of `FleetCacheWriteBackTests`: a relay told to stop (SIGTERM) while Redis
/// stalls its write takes the rotated set into service at the end of the drain, still unacknowledged. Its
/// local cache must keep the set marked as such, or the next start follows Redis's older version and the
/// fleet presents the refresh token that rotation burnt.
final class FleetCacheMarkAtShutdownTests: FleetTestCase {
    func testARotationStillUnacknowledgedAtAGracefulStopStaysMarkedInTheCacheAndIsWrittenBack() throws {
        try importTokens()
        let cachePath = workDir.appendingPathComponent("relay-a-cache.json").path
        var configA = try fleetConfig(cachingIn: cachePath)
        var timeouts = try XCTUnwrap(configA["timeouts"] as? [String: Any])
        timeouts["drain_seconds"] = 2
        configA["timeouts"] = timeouts
        let relayA = try startRelay(configA)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relayA, "/readyz").status) == 200 }, relayA.stderrText.suffix(1500).description)

        defer { _ = try? redis.cli(["CLIENT", "UNPAUSE"]) }
        let rotated = try rotateWhileRedisPausesWrites(through: relayA, cachePath: cachePath)

        relayA.signal(SIGTERM)
        XCTAssertNotNil(relayA.waitForExit(timeout: 20), "A exits after its drain")
        let cache = (try? String(contentsOfFile: cachePath, encoding: .utf8)) ?? ""
        XCTAssertTrue(cache.contains(rotated), "the rotated set is A's cache")
        XCTAssertTrue(cache.contains("redis_write_unacknowledged"),
                      "still marked as never acknowledged by Redis: \(relayA.stderrText.suffix(2500))")
        try redis.cli(["CLIENT", "UNPAUSE"])
        XCTAssertEqual(try storedVersion(), 1, "Redis never got the rotation")

        let restarted = try restartAndAwaitWriteBack(configA, rotated: rotated)
        XCTAssertEqual(try get(restarted, "/after").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "served with the rotated set, nothing presented again")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}
