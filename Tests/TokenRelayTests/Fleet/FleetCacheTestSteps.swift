import Foundation
import XCTest

/// The steps `FleetCacheWriteBackTests` and `FleetCacheMarkAtShutdownTests` share: a relay with a local cache
/// beside Redis, a rotation Redis never acknowledges, and the write-back once a restarted relay reaches Redis.
extension FleetTestCase {
    /// `fleetConfig()` with a local cache (`tokens.file` beside `tokens.redis`) at `cachePath`.
    func fleetConfig(cachingIn cachePath: String) throws -> [String: Any] {
        var config = fleetConfig()
        var tokens = try XCTUnwrap(config["tokens"] as? [String: Any])
        tokens["file"] = cachePath
        config["tokens"] = tokens
        return config
    }

    /// One refresh through `relay` whose answer comes back while Redis stalls every write (`CLIENT PAUSE
    /// WRITE`), so the rotated set is only in the relay's cache, marked as never acknowledged. Writes stay
    /// paused: the caller unpauses (and defers an unpause for a failing path). Returns the rotated refresh
    /// token. (Writes paused rather than the whole Redis stopped with SIGSTOP: a stopped Redis, once
    /// resumed, still runs the write waiting in a dead relay's socket, and the loss would not happen.)
    func rotateWhileRedisPausesWrites(through relay: TokenRelayProcess, cachePath: String) throws -> String {
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        _ = HTTPTestClient.concurrentlyAsync { try? HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/rotate").status }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls == 1 })
        try redis.cli(["CLIENT", "PAUSE", "30000", "WRITE"])
        tokenServer.openGate()
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes == 1 })
        let rotated = try XCTUnwrap(tokenServer.currentRefreshToken)
        XCTAssertTrue(waitUntil(timeout: 5) {
            let cache = (try? String(contentsOfFile: cachePath, encoding: .utf8)) ?? ""
            return cache.contains(rotated) && cache.contains("redis_write_unacknowledged")
        }, "the rotated set is in the relay's cache, marked as not acknowledged: \(relay.stderrText.suffix(1500))")
        return rotated
    }

    /// Starts a relay on `config` (the cache holding `rotated`) and waits until it has written the set back
    /// to Redis with the compare-and-set.
    func restartAndAwaitWriteBack(_ config: [String: Any], rotated: String) throws -> TokenRelayProcess {
        let restarted = try startRelay(config)
        XCTAssertTrue(waitUntil(timeout: 10) {
            (try? self.storedVersion()) == 2 && (try? self.redis.cli(["HGET", self.key, "tokens"]))?.contains(rotated) == true
        }, "written back once Redis answers: \(restarted.stderrText.suffix(2000))")
        return restarted
    }
}
