import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Fleet mode and SIGHUP: the refresh lock's life follows a reloaded `timeouts.refresh_seconds` (and
/// `tokens.redis.lock_seconds`). Fixed at start, a raised refresh_seconds left every lock too short to
/// cover a refresh: the relay took the lock, found it too short, let it go, and never refreshed until
/// restarted.
final class FleetReloadTests: FleetTestCase {
    private func reload(_ relay: TokenRelayProcess, _ config: [String: Any], file: StaticString = #filePath, line: UInt = #line) throws {
        let before = relay.stderrText.components(separatedBy: "msg=\"config reloaded\"").count
        try JSONSerialization.data(withJSONObject: config, options: [.prettyPrinted, .sortedKeys]).write(to: relay.configURL, options: .atomic)
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.components(separatedBy: "msg=\"config reloaded\"").count > before },
                      "no reload applied: \(relay.stderrText.suffix(2000))", file: file, line: line)
    }

    /// Started with refresh_seconds 2 (a lock of 2 + 5 × 0.5 = 4.5 s), reloaded to 6: the next lock lives
    /// 6 + 2.5 = 8.5 s, enough for a 6 s exchange and the write after it, and the refresh goes ahead.
    func testARaisedRefreshTimeoutLengthensTheNextLock() throws {
        try importTokens()
        let relay = try XCTUnwrap(try startFleet(1).first)
        var raised = fleetConfig()
        raised["timeouts"] = ["refresh_seconds": 6, "hold_seconds": 15]
        try reload(relay, raised)
        XCTAssertTrue(relay.stderrText.contains("needs_restart=none"), relay.stderrText)

        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/after-reload") }
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 1 },
                      "the refresh never left: \(relay.stderrText.suffix(2000))")
        // The token server holds the refresh: the lock is in Redis with the reloaded life.
        let remaining = try XCTUnwrap(Int(try redis.cli(["PTTL", key + ":lock"])))
        XCTAssertGreaterThan(remaining, 4_500, "the lock was taken with the reloaded life, not the one from start")
        XCTAssertLessThanOrEqual(remaining, 8_500)

        tokenServer.failureMode = .normal
        tokenServer.openGate()
        XCTAssertEqual(try held.wait(timeout: 20).status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertFalse(relay.stderrText.contains("too little life left"), relay.stderrText)
        XCTAssertEqual(try storedVersion(), 2)
    }

    /// A lock_seconds that no longer covers the reloaded refresh_seconds is an invalid config: one line
    /// names the field, the running config (and its lock) stays.
    func testALockSecondsTooShortForTheReloadedRefreshTimeoutIsRefused() throws {
        try importTokens()
        let relay = try XCTUnwrap(try startFleet(1, ["lock_seconds": 4]).first)
        var raised = fleetConfig(["lock_seconds": 4])
        raised["timeouts"] = ["refresh_seconds": 6, "hold_seconds": 15]
        try JSONSerialization.data(withJSONObject: raised, options: [.prettyPrinted, .sortedKeys]).write(to: relay.configURL, options: .atomic)
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("config reload failed") }, relay.stderrText)
        let failure = relay.stderrText.split(separator: "\n").first { $0.contains("config reload failed") } ?? ""
        XCTAssertTrue(failure.contains("tokens.redis.lock_seconds: must be at least"), "\(failure)")

        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/still-refreshes").status, 200, "the running refresh_seconds and lock still work")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
    }
}
