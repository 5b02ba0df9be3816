import Foundation
import XCTest

/// `/metrics` explains itself: every family has `# HELP` text, and Prometheus's own linter accepts the
/// whole exposition.
final class MetricsExpositionTests: RelayTestCase {
    /// A relay that has been through a refresh, and answered requests, so the labelled
    /// families (requests by status, refresh outcomes and triggers, replays) have series to show.
    private func exercisedMetrics() throws -> String {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 200)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200, "401, one refresh, replay")
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_refreshes_total{outcome=\"success\"}"), metrics)
        return metrics
    }

    func testEveryFamilyHasHelpText() throws {
        let lines = try exercisedMetrics().split(separator: "\n")
        let typed = lines.filter { $0.hasPrefix("# TYPE ") }.map { $0.split(separator: " ")[2] }
        let helped = Set(lines.filter { $0.hasPrefix("# HELP ") }.map { $0.split(separator: " ")[2] })
        XCTAssertGreaterThan(typed.count, 15)
        for name in typed {
            XCTAssertTrue(helped.contains(name), "\(name) has no # HELP line")
        }
        let help = lines.filter { $0.hasPrefix("# HELP ") }
        XCTAssertFalse(help.contains { $0.split(separator: " ", maxSplits: 3).count < 4 }, "empty help text: \(help)")
    }

    func testPromtoolAcceptsTheExposition() throws {
        guard let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first(where: FileManager.default.isExecutableFile) else {
            throw XCTSkip("promtool not installed (Debian package prometheus, ~100 MB, so not in scripts/ensure-deps)")
        }
        let file = workDir.appendingPathComponent("metrics.txt")
        try Data(try exercisedMetrics().utf8).write(to: file)
        let result = try runTool("/bin/sh", ["-c", "exec \"$0\" check metrics < \"$1\"", promtool, file.path])
        XCTAssertEqual(result.exitCode, 0, "promtool: \(result.stdout) \(result.stderr)")
        XCTAssertEqual(result.stdout + result.stderr, "", "no lint findings")
    }
}
