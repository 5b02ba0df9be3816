import XCTest

/// `tokenrelay demo` is the README's first command: it must show the 401 path working.
final class DemoCommandTests: XCTestCase {
    func testDemoShowsCoalescedRefreshesWithoutReuse() throws {
        let result = try TokenRelayProcess.runCommand(arguments: ["demo", "--seconds", "5.5"], timeout: 30)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("curl -i http://127.0.0.1:"), result.stdout)
        let bursts = result.stdout.split(separator: "\n").filter { $0.hasPrefix("demo burst") }
        XCTAssertGreaterThanOrEqual(bursts.count, 2, result.stdout)
        for burst in bursts { XCTAssertTrue(burst.contains("8×200") && burst.contains("reuse detected: 0"), String(burst)) }
        XCTAssertTrue(result.stdout.contains("API 401s so far: 8,"), "the first burst must have hit an expired token")
        XCTAssertTrue(result.stderr.contains("refresh succeeded"), result.stderr)
    }

    /// `tokenrelay demo --fleet`: three relays on one local redis-server; one refresh per expiry for the
    /// whole fleet, never a reuse.
    func testFleetDemoRefreshesOncePerExpiryForTheWholeFleet() throws {
        try RedisServerProcess.requireInstalled()
        let result = try TokenRelayProcess.runCommand(arguments: ["demo", "--fleet", "--seconds", "5.5"], timeout: 30)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        let bursts = result.stdout.split(separator: "\n").filter { $0.hasPrefix("demo fleet relay") }
        XCTAssertGreaterThanOrEqual(bursts.count, 6, result.stdout)
        for burst in bursts { XCTAssertTrue(burst.contains("4×200") && burst.contains("reuse detected: 0"), String(burst)) }
        let refreshes = result.stdout.split(separator: "\n").filter { $0.contains("token server: refresh #") }.count
        XCTAssertGreaterThanOrEqual(refreshes, 1)
        XCTAssertLessThanOrEqual(refreshes, 3, "about one per 2 s expiry for the whole fleet, not one per relay")
        XCTAssertTrue(result.stderr.contains("adopted"), "the other relays adopt")
    }
}
