import Foundation
import XCTest

/// Responses from an HTTP/2 upstream are treated as an HTTP/1.1 upstream's: heads it may send (findings of
/// the response fuzz target, Tests/Fuzz/HTTP2Response), and a 401 to a streamed upload that comes before the
/// body was asked for (`expect: 100-continue`).
final class HTTP2UpstreamResponseTests: RelayTestCase {
    private var h2: H2Upstream?

    override func tearDownWithError() throws {
        h2?.stop()
        try super.tearDownWithError()
    }

    /// 256 fields is within the HTTP/1.1 upstream limit; the framing line the mapping adds made 257 and the
    /// response a 502 from an HTTP/2 upstream only.
    func testAResponseWith256FieldsPassesAsFromAnHTTP1Upstream() throws {
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
        let upstream = try H2Upstream(workDir: workDir, settings: ["many_fields_paths": ["/many"]])
        h2 = upstream
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.url, "http2": "prior_knowledge"]])
        let response = try get(relay, "/many")
        XCTAssertEqual(response.status, 200, relay.stderrText.suffix(600).description)
        XCTAssertEqual(response.headers.filter { $0.0.lowercased().hasPrefix("x-f") }.count, 256)
    }

    /// A body over `limits.max_body_bytes` goes with `expect: 100-continue`: the upstream's 401 to the expired
    /// token comes before any body byte, so the request is refreshed once and replayed, and the body reaches
    /// the upstream once, whole. (Before, the body flowed at once and the 401 went to the client.)
    func testA401BeforeAStreamedBodyIsRefreshedAndReplayed() throws {
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
        let upstream = try H2Upstream(workDir: workDir)
        h2 = upstream
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.url, "http2": "prior_knowledge"],
                                    "limits": ["max_body_bytes": 65536]])
        let old = try XCTUnwrap(tokenServer.currentAccessToken)
        try upstream.reject([old])
        let file = workDir.appendingPathComponent("upload.bin")
        try Data(repeating: 0x61, count: 3 * 1024 * 1024).write(to: file)
        for (name, extra) in [("HTTP/1.1 client", [String]()), ("h2c client", ["--http2-prior-knowledge"])] {
            let result = try runTool("curl", ["-sS", "--max-time", "30"] + extra + ["-X", "POST", "--data-binary", "@\(file.path)",
                                                                                   "\(relay.proxyURL)/upload"], timeout: 40)
            XCTAssertTrue(result.stdout.hasSuffix("ok /upload 3145728\n"), "\(name): \(result.stdout) \(result.stderr)")
            if name == "HTTP/1.1 client" {
                XCTAssertEqual(upstream.refusedBeforeBodyCount, 1, "the first send was refused at its head")
                XCTAssertEqual(tokenServer.successfulRefreshes, 1)
                XCTAssertEqual(tokenServer.reuseDetections, 0)
            }
        }
        let new = try XCTUnwrap(tokenServer.currentAccessToken)
        XCTAssertEqual(upstream.requests.map(\.bodyBytes), [3145728, 3145728], "each body once, whole")
        XCTAssertEqual(upstream.requests.map { $0.field("authorization") }, ["Bearer \(new)", "Bearer \(new)"])
        XCTAssertEqual(upstream.requests.first?.field("expect"), "100-continue")
    }

    /// An upstream that never answers the expectation gets the body after `timeouts.continue_seconds`.
    func testAStreamedBodyGoesAfterTheContinueWaitWhenNo100Comes() throws {
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
        let upstream = try H2Upstream(workDir: workDir, settings: ["ignore_expect": true])
        h2 = upstream
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.url, "http2": "prior_knowledge"],
                                    "limits": ["max_body_bytes": 65536], "timeouts": ["continue_seconds": 0.3]])
        let file = workDir.appendingPathComponent("upload.bin")
        try Data(repeating: 0x61, count: 1024 * 1024).write(to: file)
        let result = try runTool("curl", ["-sS", "--max-time", "30", "-X", "POST", "--data-binary", "@\(file.path)",
                                          "\(relay.proxyURL)/upload"], timeout: 40)
        XCTAssertEqual(result.stdout, "ok /upload 1048576\n", result.stderr)
        XCTAssertEqual(upstream.requests.map(\.bodyBytes), [1048576])
    }
}
