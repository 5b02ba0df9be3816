import XCTest
@testable import TokenRelay

/// Issue 24: a fleet refreshes no more often than one relay. In process, on a manual clock: relays (the
/// refresh machine and a driver like the coordinator each) share a simulated Redis under steady load
/// (`SimulatedFleet`). Before the rule in `scheduleProactiveRefresh`, 3 relays made 16-17 refreshes of
/// 2-s tokens in 12 s where one relay makes 12, as measured end to end.
final class FleetRefreshRateTests: XCTestCase {
    private func run(relays: Int, lifetime: Double = 2, seconds: Double = 12, wallFraction: Double, olderValid: Bool,
                     _ meanwhile: (SimulatedFleet) -> Void = { _ in }) -> SimulatedFleet {
        let fleet = SimulatedFleet(relays: relays, accessTokenLifetime: lifetime, wallFraction: wallFraction,
                                   olderAccessTokensStayValid: olderValid)
        meanwhile(fleet)
        fleet.run(until: seconds)
        return fleet
    }

    private func describe(_ fleet: SimulatedFleet) -> String {
        "answers \(fleet.answers), refreshes at " + fleet.refreshLog.map { String(format: "%.3f by %d", $0.at, $0.relay) }.joined(separator: ", ")
    }

    /// Both kinds of upstream: one that accepts an access token until it expires (the relays that adopted a
    /// set then get no 401 that would start a cycle of their own: the case that refreshed too often), and
    /// one that accepts only the newest. The stored expiry is whole seconds: cut at several fractions.
    func testAFleetRefreshesNoMoreOftenThanOneRelay() {
        for olderValid in [true, false] {
            for fraction in [0.0, 0.5, 0.9] {
                let alone = run(relays: 1, wallFraction: fraction, olderValid: olderValid)
                XCTAssertEqual(alone.reuse, 0)
                XCTAssertGreaterThanOrEqual(alone.refreshes, 6, "one relay keeps its 2-s tokens fresh")
                for count in [3, 5, 10] {
                    let fleet = run(relays: count, wallFraction: fraction, olderValid: olderValid)
                    let context = "\(count) relays, older tokens valid: \(olderValid), fraction \(fraction); \(describe(fleet))"
                    XCTAssertEqual(fleet.reuse, 0, context)
                    XCTAssertEqual(fleet.answers.keys.sorted(), [200], "only 200s: " + context)
                    XCTAssertLessThanOrEqual(fleet.refreshes, alone.refreshes + 1, "one relay alone made \(alone.refreshes): " + context)
                }
            }
        }
    }

    /// Longer tokens, where the skew and the jitter (not the minimum spacing) decide when a set is due, over
    /// 40 lifetimes. The stored expiry has milliseconds: cut to whole seconds (as the Redis value was), an
    /// adopted set looked due up to a second early, and 5 relays made 46 refreshes of 10-s tokens where one
    /// makes 44.
    func testLongerTokensToo() {
        for lifetime in [10.0, 30.0] {
            let alone = run(relays: 1, lifetime: lifetime, seconds: lifetime * 40, wallFraction: 0.7, olderValid: true) { $0.requestInterval = 0.2 }
            let fleet = run(relays: 5, lifetime: lifetime, seconds: lifetime * 40, wallFraction: 0.7, olderValid: true) { $0.requestInterval = 0.2 }
            XCTAssertEqual(fleet.reuse, 0)
            XCTAssertEqual(fleet.answers.keys.sorted(), [200], describe(fleet))
            XCTAssertLessThanOrEqual(fleet.refreshes, alone.refreshes + 1, "\(lifetime)-s tokens: one relay made \(alone.refreshes); \(describe(fleet))")
            XCTAssertEqual(fleet.refreshers.count, 1, "the relay that got a set refreshes it again: \(describe(fleet))")
        }
    }

    /// The relay that got the set stops (killed between two refreshes): the others refresh in its place,
    /// before the token expires, once.
    func testAnotherRelayTakesOverWhenTheRefreshingOneStops() {
        var victim = -1
        let fleet = run(relays: 3, wallFraction: 0.5, olderValid: true) { fleet in
            fleet.run(until: 5.1)
            victim = fleet.refreshLog.last?.relay ?? -1
            fleet.relays[victim].kill()
        }
        XCTAssertEqual(fleet.reuse, 0)
        XCTAssertEqual(fleet.answers.keys.sorted(), [200], describe(fleet))
        XCTAssertTrue(fleet.refreshLog.contains { $0.at > 5.1 && $0.relay != victim }, describe(fleet))
        XCTAssertLessThanOrEqual(fleet.refreshes, 13, describe(fleet))
        XCTAssertGreaterThanOrEqual(fleet.refreshes, 10, describe(fleet))
    }
}
