import Foundation
import XCTest

/// `timeouts.stream_idle_seconds` measures the upstream's silence while the relay is ready to read it.
/// When a slow client makes the relay stop reading (HTTP/1.1: the socket is not read, or a splice's pipe
/// is full; HTTP/2: the stream's window is not handed back), the upstream goes quiet because of us: the
/// limit must not cut the response for that, and counts again from the moment reading resumes.
final class SlowClientSilenceTests: RelayTestCase {
    private var h2: H2Upstream?

    override func tearDownWithError() throws {
        h2?.stop()
        try super.tearDownWithError()
    }

    /// The client reads the head, then nothing for `stall` seconds (three silence limits: the scenario, not
    /// a synchronisation), then the body up to `total` bytes or the connection's end. Returns the bytes read.
    private func readWithAStall(_ relay: TokenRelayProcess, _ path: String, total: Int, stall: Double,
                                beforeStall: () -> Void = {}) throws -> Int {
        let client = try StreamingClient(port: relay.proxyPort, timeout: 20, receiveBuffer: 32 * 1024)
        defer { client.close() }
        try client.get(path, port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        beforeStall()
        Thread.sleep(forTimeInterval: stall)
        var received = 0
        while received < total {
            let n = try client.readRaw(upTo: min(64 * 1024, total - received))
            if n == 0 { break }
            received += n
        }
        return received
    }

    func testAPausedH2UpstreamStreamIsNotCutForTheClientsSlowness() throws {
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
        let total = 8 * 1024 * 1024
        let upstream = try H2Upstream(workDir: workDir, settings: ["large_paths": ["/big": total]])
        h2 = upstream
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.url, "http2": "prior_knowledge"],
                                    "timeouts": ["stream_idle_seconds": 1]])
        let received = try readWithAStall(relay, "/big", total: total, stall: 3) {
            // The stall starts once the upstream has used up the window the relay gave it: from there on it
            // is silent only because the relay holds its window.
            XCTAssertTrue(waitUntil(timeout: 10) { upstream.windowClosedCount > 0 }, "the upstream never ran out of window")
        }
        XCTAssertEqual(received, total, "the response was cut: \(relay.stderrText.suffix(600))")
        XCTAssertFalse(relay.stderrText.contains("timed out"), relay.stderrText)
    }

    /// The HTTP/1.1 path, both ways of relaying a body: chunked (read and copied, the socket paused while the
    /// client is behind) and a large Content-Length (spliced, the upstream unread while the pipe is full).
    func testAPausedHTTP1UpstreamIsNotCutForTheClientsSlowness() throws {
        let total = 32 * 1024 * 1024
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                let block = Data(repeating: 0x78, count: 1024 * 1024)
                if request.path == "/chunked" {
                    try connection.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for _ in 0..<(total / block.count) {
                        try connection.write(String(block.count, radix: 16) + "\r\n")
                        try connection.write(block)
                        try connection.write("\r\n")
                    }
                    try connection.write("0\r\n\r\n")
                } else {
                    try connection.write("HTTP/1.1 200 OK\r\nContent-Length: \(total)\r\n\r\n")
                    for _ in 0..<(total / block.count) { try connection.write(block) }
                }
            }
        }
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.baseURL],
                                    "timeouts": ["stream_idle_seconds": 1]])
        let spliced = try readWithAStall(relay, "/length", total: total, stall: 3)
        XCTAssertEqual(spliced, total, "the spliced response was cut: \(relay.stderrText.suffix(600))")
        let client = try StreamingClient(port: relay.proxyPort, timeout: 20, receiveBuffer: 32 * 1024)
        defer { client.close() }
        try client.get("/chunked", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        Thread.sleep(forTimeInterval: 3)
        var received = 0
        while let chunk = try client.readChunk() { received += chunk.count }
        XCTAssertEqual(received, total, "the chunked response was cut: \(relay.stderrText.suffix(600))")
    }
}
