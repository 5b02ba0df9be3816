import Foundation
import XCTest

/// Real-time soak of the fleet (the rules keep their fast tests in FleetTests and RefreshMachineTests).
final class FleetSoakTests: FleetTestCase {
    override var accessTokenLifetime: Double? { 2 }

    /// Soak (TOKENRELAY_SLOW_TESTS=1): 5 relays under steady load for 20 s with 2 s tokens: no client-visible
    /// 401, no reuse, about one refresh per token lifetime for the whole fleet.
    func testFiveRelaysUnderSteadyLoadWithShortTokens() throws {
        try skipUnlessSlowTestsEnabled("FleetTests.testBurstAfterExpiryOverFiveRelaysRefreshesOnceFleetWide and RefreshMachineTests")
        try importTokens()
        let relays = try startFleet(5)
        tokenServer.expireAccessTokens()
        let ports = relays.map(\.proxyPort)
        let deadline = Date().addingTimeInterval(20)
        let results = HTTPTestClient.concurrently(10, timeout: 60) { worker -> [Int: Int] in
            var counts: [Int: Int] = [:]
            var index = 0
            while Date() < deadline {
                let status = (try? HTTPTestClient.send(port: ports[worker % ports.count], method: "GET", path: "/soak/\(worker)/\(index)").status) ?? -1
                counts[status, default: 0] += 1
                index += 1
            }
            return counts
        }
        var total: [Int: Int] = [:]
        for case .success(let counts) in results { total.merge(counts, uniquingKeysWith: +) }
        XCTAssertEqual(total.keys.sorted(), [200], "\(total)")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertLessThanOrEqual(tokenServer.successfulRefreshes, 20, "about one per 2 s lifetime fleet-wide, not one per relay")
        XCTAssertGreaterThanOrEqual(tokenServer.successfulRefreshes, 8)
    }
}
