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
        let run = try failoverUnderLoad(relays: try startSentinelFleet(3, ["wait_replicas": 1], hold: Self.hold))
        print("sentinel failover under load: \(run)")
    }

    /// Not a timed test: figures for the note (TOKENRELAY_SLOW_TESTS=1, TOKENRELAY_FAILOVER_RUNS runs, 8 by
    /// default), each on a fresh Redis group, fresh relays and a fresh token family. Prints the time from
    /// the master's SIGKILL to every relay ready on the new master, and the 503s the clients saw.
    func testMeasureFailoverRecovery() throws {
        try skipUnlessSlowTestsEnabled("testTheMasterKilledUnderSteadyLoadLosesNoRotation (this only measures)")
        let runs = Int(ProcessInfo.processInfo.environment["TOKENRELAY_FAILOVER_RUNS"] ?? "") ?? 8
        var results: [Run] = []
        for index in 0..<runs {
            if index > 0 {
                group.stop()
                group = try RedisSentinelGroup()
                let tokens = tokenServer.issueInitialTokens()
                try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh)
            }
            try importThroughSentinels()
            let relays = try startSentinelFleet(3, ["wait_replicas": 1], hold: Self.hold)
            let run = try failoverUnderLoad(relays: relays)
            print("run \(index + 1): \(run)")
            results.append(run)
            relays.forEach { _ = $0.stop() }
        }
        func percentile(_ values: [Double], _ p: Double) -> Double {
            let sorted = values.sorted()
            return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * p).rounded(.up)))]
        }
        let down = results.map(\.downFor)
        let lag = results.map { $0.downFor - $0.promotedAfter }
        print(String(format: "relays after the sentinels: p50 %.2f s, p99 %.2f s", percentile(lag, 0.5), percentile(lag, 0.99)))
        print(String(format: "failover over %d runs: every relay ready again p50 %.2f s, p99 %.2f s (min %.2f, max %.2f); 503 windows p50 %.2f s, max %.2f s",
                     results.count, percentile(down, 0.5), percentile(down, 0.99), down.min() ?? 0, down.max() ?? 0,
                     percentile(results.map(\.unavailableWindow), 0.5), results.map(\.unavailableWindow).max() ?? 0))
    }

    static let hold = 3.0

    struct Run: CustomStringConvertible {
        let downFor: Double
        /// When the sentinels (asked every 50 ms) first named the promoted replica.
        let promotedAfter: Double
        let counts: [Int: Int]
        /// From the first 503 a client saw to the last (0 when none).
        let unavailableWindow: Double
        var description: String {
            String(format: "sentinels named the new master %.2f s, every relay ready again %.2f s after the kill; 503s over %.2f s; answers ",
                   promotedAfter, downFor, unavailableWindow)
                + counts.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
        }
    }

    /// Steady load on the relays, the master SIGKILLed once they refresh under it; asserts the rules and
    /// returns the figures.
    func failoverUnderLoad(relays: [TokenRelayProcess]) throws -> Run {
        let hold = Self.hold
        let reuseBefore = tokenServer.reuseDetections
        let refreshesBefore = tokenServer.successfulRefreshes
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
        XCTAssertTrue(waitUntil(timeout: 15) { self.tokenServer.successfulRefreshes >= refreshesBefore + 3 }, "refreshing under load before the kill")

        let oldPort = try XCTUnwrap(group.nodes[0].tcpPort)
        let killedAt = Date()
        group.nodes[0].kill9()
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { (self.group.masterPortNamedBySentinels ?? oldPort) != oldPort },
                      "the sentinels promoted a replica")
        let promotedAt = Date()
        let newPort = try XCTUnwrap(group.masterPortNamedBySentinels)
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { relays.allSatisfy { self.follows($0, port: newPort) } },
                      "every relay ready again on the new master by itself: \(relays.map { master($0) })")
        let recoveredAt = Date()
        let refreshesAtRecovery = tokenServer.successfulRefreshes
        XCTAssertTrue(waitUntil(timeout: 15) { self.tokenServer.successfulRefreshes >= refreshesAtRecovery + 2 }, "refreshes go on after the failover")
        stop.withLock { $0 = true }
        let seen = try load.wait(timeout: 60)

        let counts = Dictionary(grouping: seen, by: \.status).mapValues(\.count)
        if let directory = ProcessInfo.processInfo.environment["TOKENRELAY_FAILOVER_LOGS"],
           !Set(counts.keys).subtracting([200, 503]).isEmpty || recoveredAt.timeIntervalSince(killedAt) > 3.5 {
            let stamp = Int(killedAt.timeIntervalSince1970)
            let firstOther = seen.filter { $0.status != 200 && $0.status != 503 }.map(\.at).min()
            for (index, relay) in relays.enumerated() {
                try? (relay.stderrText + "\nkilled at \(killedAt.timeIntervalSince1970) promoted \(promotedAt.timeIntervalSince1970) recovered "
                      + "\(recoveredAt.timeIntervalSince1970) first other status \(firstOther?.timeIntervalSince1970 ?? 0)\n")
                    .write(toFile: "\(directory)/relay-\(stamp)-\(index).log", atomically: true, encoding: .utf8)
            }
        }
        XCTAssertEqual(Set(counts.keys).subtracting([200, 503]), [], "only 200s and clean 503s: \(counts)")
        XCTAssertGreaterThan(counts[200] ?? 0, 100, "\(counts)")
        let unavailable = seen.filter { $0.status == 503 }
        XCTAssertTrue(unavailable.allSatisfy(\.retryAfter), "every 503 carries Retry-After")
        XCTAssertTrue(unavailable.allSatisfy { $0.at >= killedAt && $0.at <= recoveredAt.addingTimeInterval(hold + 1) },
                      "503s only in the failover window")
        XCTAssertEqual(tokenServer.reuseDetections, reuseBefore, "no refresh token presented twice")
        XCTAssertFalse(tokenServer.isCurrentFamilyRevoked)

        let newMaster = try XCTUnwrap(group.node(port: newPort))
        XCTAssertTrue(waitUntil(timeout: 10) {
            ((try? newMaster.cli(["HGET", self.key, "tokens"])) ?? "").contains(self.tokenServer.currentRefreshToken ?? "-")
        }, "the new master holds the latest rotation")
        for relay in relays {
            XCTAssertEqual(master(relay)["failovers_followed"] as? Int, 1, "\(master(relay))")
        }
        let window = unavailable.isEmpty ? 0 : (unavailable.map(\.at).max()!).timeIntervalSince(unavailable.map(\.at).min()!)
        return Run(downFor: recoveredAt.timeIntervalSince(killedAt), promotedAfter: promotedAt.timeIntervalSince(killedAt), counts: counts,
                   unavailableWindow: window)
    }
}
