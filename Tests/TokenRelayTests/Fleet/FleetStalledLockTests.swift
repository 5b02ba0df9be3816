import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Redis stalls (SIGSTOP) while a relay's lock `SET` is on its way, and resumes after the relay has given
/// the connection up: Redis then runs the `SET`, and the lock is the relay's own without the relay
/// knowing it. The next cycle must not wait out `lock_seconds` (and every request `hold_seconds`) on it.
final class FleetStalledLockTests: FleetTestCase {
    func testALockWhoseSETReplyWasLostDoesNotBlockTheNextRefresh() throws {
        try importTokens()
        let relay = try startFleet(1, ["lock_seconds": 60])[0]
        XCTAssertEqual(try get(relay, "/warm").status, 200)
        let pid = try XCTUnwrap(redis.pid)
        tokenServer.expireAccessTokens()
        kill(pid, SIGSTOP)
        var resumed = false
        defer { if !resumed { kill(pid, SIGCONT) } }
        // The 401 starts a cycle whose `SET … NX` waits in Redis' socket; the command timeout ends the wait.
        XCTAssertEqual(try get(relay, "/during").status, 503)
        kill(pid, SIGCONT)
        resumed = true
        XCTAssertTrue(waitUntil(timeout: 12) { (try? HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/after", timeout: 4).status) == 200 },
                      "refreshed once Redis answered again, not after the lock's lifetime: \(relay.stderrText.suffix(5000))")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}
