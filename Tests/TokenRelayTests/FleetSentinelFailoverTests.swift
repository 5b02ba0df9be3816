import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A Sentinel failover under steady load with 2-s tokens: the master SIGKILLed mid-run.
final class FleetSentinelFailoverTests: FleetSentinelTestCase {
    override var accessTokenLifetime: Double? { 2 }

    /// One answer a load client saw: when, the status (-1: no HTTP answer at all, a reset or a timeout),
    /// and whether a 503 carried Retry-After.
    struct Seen: Sendable {
        let at: Date
        let status: Int
        let retryAfter: Bool
    }

    /// Three relays, `wait_replicas: 1`, six clients: 0 reuse at the token server, only 200s and clean
    /// 503s (with Retry-After, none before the kill or long after the recovery), every relay ready again
    /// by itself on the promoted master, refreshes going on after it, and the new master holding the
    /// latest rotation.
    func testTheMasterKilledUnderSteadyLoadLosesNoRotation() throws {
        try importThroughSentinels()
        let hold = 3.0
        let relays = try startSentinelFleet(3, ["wait_replicas": 1], hold: hold)
        let ports = relays.map(\.proxyPort)
        let stop = Locked(false)
        let load = HTTPTestClient.concurrentlyAsync { () -> [Seen] in
            HTTPTestClient.concurrently(6, timeout: 90) { worker -> [Seen] in
                var seen: [Seen] = []
                var index = 0
                let deadline = Date().addingTimeInterval(60)
                while !stop.withLock({ $0 }) && Date() < deadline {
                    let response = try? HTTPTestClient.send(port: ports[(worker + index) % ports.count], method: "GET", path: "/load/\(worker)/\(index)")
                    seen.append(Seen(at: Date(), status: response?.status ?? -1, retryAfter: response?.header("Retry-After") != nil))
                    index += 1
                }
                return seen
            }.flatMap { (try? $0.get()) ?? [] }
        }
        defer { stop.withLock { $0 = true } }
        XCTAssertTrue(waitUntil(timeout: 15) { self.tokenServer.successfulRefreshes >= 3 }, "refreshing under load before the kill")

        let oldPort = try XCTUnwrap(group.nodes[0].tcpPort)
        let killedAt = Date()
        group.nodes[0].kill9()
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { (self.group.masterPortNamedBySentinels ?? oldPort) != oldPort },
                      "the sentinels promoted a replica")
        let newPort = try XCTUnwrap(group.masterPortNamedBySentinels)
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { relays.allSatisfy { self.follows($0, port: newPort) } },
                      "every relay ready again on the new master by itself: \(relays.map { master($0) })")
        let recoveredAt = Date()
        let refreshesAtRecovery = tokenServer.successfulRefreshes
        XCTAssertTrue(waitUntil(timeout: 15) { self.tokenServer.successfulRefreshes >= refreshesAtRecovery + 2 }, "refreshes go on after the failover")
        stop.withLock { $0 = true }
        let seen = try load.wait(timeout: 60)

        let counts = Dictionary(grouping: seen, by: \.status).mapValues(\.count)
        XCTAssertEqual(Set(counts.keys).subtracting([200, 503]), [], "only 200s and clean 503s: \(counts)")
        XCTAssertGreaterThan(counts[200] ?? 0, 100, "\(counts)")
        let unavailable = seen.filter { $0.status == 503 }
        XCTAssertTrue(unavailable.allSatisfy(\.retryAfter), "every 503 carries Retry-After")
        XCTAssertTrue(unavailable.allSatisfy { $0.at >= killedAt && $0.at <= recoveredAt.addingTimeInterval(hold + 1) },
                      "503s only in the failover window")
        XCTAssertEqual(tokenServer.reuseDetections, 0, "no refresh token presented twice")
        XCTAssertFalse(tokenServer.isCurrentFamilyRevoked)

        let newMaster = try XCTUnwrap(group.node(port: newPort))
        XCTAssertTrue(waitUntil(timeout: 10) {
            ((try? newMaster.cli(["HGET", self.key, "tokens"])) ?? "").contains(self.tokenServer.currentRefreshToken ?? "-")
        }, "the new master holds the latest rotation")
        for relay in relays {
            XCTAssertEqual(master(relay)["failovers_followed"] as? Int, 1, "\(master(relay))")
        }
        let downFor = recoveredAt.timeIntervalSince(killedAt)
        print("sentinel failover under load: every relay serving again \(String(format: "%.2f", downFor)) s after the kill; answers \(counts)")
    }
}
