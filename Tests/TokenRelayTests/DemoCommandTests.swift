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
}
