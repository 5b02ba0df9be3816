import Foundation
import XCTest

/// Response heads from an HTTP/2 upstream are read as an HTTP/1.1 upstream's would be: what one may send,
/// the other may too (findings of the response fuzz target, Tests/Fuzz/HTTP2Response).
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
}
