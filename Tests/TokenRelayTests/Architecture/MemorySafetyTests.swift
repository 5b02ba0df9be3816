import Foundation
import XCTest
@testable import TokenRelay

/// A short proxy session under valgrind's memcheck: requests, a 401 that triggers a refresh and a
/// replay, a streamed response, a client that hangs up, then SIGTERM and the drain. Any invalid read or
/// write, including during teardown, fails the test. Skipped (with the reason) where valgrind is absent;
/// `scripts/ensure-deps --test` installs it.
final class MemorySafetyTests: RelayTestCase {
    private static let valgrind = "/usr/bin/valgrind"

    func testShortSessionHasNoMemoryErrors() throws {
        try XCTSkipUnless(FileManager.default.isExecutableFile(atPath: Self.valgrind), "valgrind is not installed")
        // valgrind 3.19 cannot read the DWARF 5 that Swift writes into debug builds: run a copy without it.
        let binary = workDir.appendingPathComponent("tokenrelay-stripped")
        let strip = Process()
        strip.executableURL = URL(fileURLWithPath: "/usr/bin/objcopy")
        strip.arguments = ["--strip-debug", try TokenRelayProcess.binaryURL().path, binary.path]
        try strip.run()
        strip.waitUntilExit()
        XCTAssertEqual(strip.terminationStatus, 0, "objcopy --strip-debug failed")
        let report = workDir.appendingPathComponent("valgrind.log")
        let suppressions = testFixtures.appendingPathComponent("valgrind-swift.supp")
        let relay = try startRelay(wrapper: [Self.valgrind, "--tool=memcheck", "--error-exitcode=99", "--leak-check=no",
                                             "--log-file=\(report.path)", "--suppressions=\(suppressions.path)", binary.path], startupTimeout: 90)
        XCTAssertEqual(try get(relay, "/first").status, 200)
        tokenServer.expireAccessTokens()
        let port = relay.proxyPort
        let replayed = HTTPTestClient.concurrently(4) { index in
            try HTTPTestClient.send(port: port, method: "GET", path: "/after-expiry/\(index)").status
        }
        XCTAssertEqual(replayed.compactMap { try? $0.get() }, [200, 200, 200, 200])
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload", body: Data(repeating: 7, count: 200_000)).status, 200)
        // A response large enough for the spliced path (socket -> pipe -> socket), then an ordinary one.
        let big = Data((0..<(2 * 1024 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        api.responseOverride = { request in
            request.target == "/big" ? TestResponse(status: 200, headers: [("Content-Type", "application/octet-stream")], body: big) : nil
        }
        let download = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/big", timeout: 60)
        XCTAssertEqual(download.status, 200)
        XCTAssertEqual(download.body, big)
        api.responseOverride = nil
        let abandoned = try HTTPTestConnection(port: relay.proxyPort)
        try abandoned.writeRaw("GET /abandoned HTTP/1.1\r\nHost: x\r\n")
        abandoned.close()
        // HTTP/2 with prior knowledge: concurrent streams, one reset before its answer, a gRPC refusal,
        // and a connection left open into the shutdown (it gets GOAWAY).
        if toolExists("nghttp") {
            let streams = try runTool("nghttp", ["-n", "-m", "20", "\(relay.proxyURL)/h2"], timeout: 120)
            XCTAssertEqual(streams.exitCode, 0, streams.stderr)
        }
        let h2 = try RawHTTP2Client(port: relay.proxyPort, timeout: 60)
        try h2.sendHeaders(stream: 1, RawHTTP2Client.request("GET", "/h2-reset"), endStream: true)
        try h2.sendReset(stream: 1)
        try h2.sendHeaders(stream: 3, RawHTTP2Client.request("POST", "/pkg.S/M", extra: [("content-type", "application/grpc")]), endStream: true)
        try h2.sendHeaders(stream: 5, RawHTTP2Client.request("GET", "/h2-last"), endStream: true)
        _ = h2.readFrames { $0.stream == 5 && $0.flags & RawHTTP2Client.endStream != 0 }
        XCTAssertEqual(try admin(relay, "/metrics").status, 200)
        relay.signal(SIGTERM)
        let exitCode = relay.waitForExit(timeout: 60)
        let text = (try? String(contentsOf: report, encoding: .utf8)) ?? ""
        XCTAssertEqual(exitCode, 0, "valgrind found errors (exit 99) or the relay failed:\n\(text)")
        XCTAssertTrue(text.contains("ERROR SUMMARY: 0 errors"), String(text.suffix(6000)))
    }
}

/// The HTTP/2 upstream side (`upstream.http2`) under memcheck: streams multiplexed on an h2c upstream,
/// a refresh and replay, a stream the upstream resets, a GOAWAY mid-burst, streamed uploads (one refused at
/// its `expect: 100-continue` head and replayed), then SIGTERM.
final class HTTP2UpstreamMemorySafetyTests: RelayTestCase {
    func testAnHTTP2UpstreamSessionHasNoMemoryErrors() throws {
        let valgrind = "/usr/bin/valgrind"
        try XCTSkipUnless(FileManager.default.isExecutableFile(atPath: valgrind), "valgrind is not installed")
        try XCTSkipUnless(toolExists("nghttp"), "nghttp is not installed")
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed")
        }
        let upstream = try H2Upstream(workDir: workDir, settings: ["goaway_after": 30, "reset_paths": ["/reset"]])
        defer { upstream.stop() }
        let binary = workDir.appendingPathComponent("tokenrelay-stripped")
        let strip = try runTool("/usr/bin/objcopy", ["--strip-debug", try TokenRelayProcess.binaryURL().path, binary.path], timeout: 60)
        XCTAssertEqual(strip.exitCode, 0, strip.stderr)
        let report = workDir.appendingPathComponent("valgrind-h2up.log")
        let suppressions = testFixtures.appendingPathComponent("valgrind-swift.supp")
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.url, "http2": "prior_knowledge"],
                                    "limits": ["max_body_bytes": 65536]],
                                   wrapper: [valgrind, "--tool=memcheck", "--error-exitcode=99", "--leak-check=no",
                                             "--log-file=\(report.path)", "--suppressions=\(suppressions.path)", binary.path],
                                   startupTimeout: 90)
        XCTAssertEqual(try get(relay, "/first").status, 200)
        try upstream.reject([tokenServer.currentAccessToken ?? ""])
        XCTAssertEqual(try get(relay, "/after-expiry").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        let uris = (1...40).map { "\(relay.proxyURL)/burst/\($0)" } + ["\(relay.proxyURL)/reset"]
        _ = try runTool("nghttp", ["-n"] + uris, timeout: 180)
        let upload = try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload", body: Data(repeating: 7, count: 300_000), timeout: 60)
        XCTAssertEqual(upload.status, 200)
        // A streamed upload refused at its `expect: 100-continue` head: the stream's continue wait ends with
        // the 401, the stream is reset, and the request goes again after a refresh.
        try upstream.reject([tokenServer.currentAccessToken ?? ""])
        let refused = try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload2", body: Data(repeating: 7, count: 300_000), timeout: 60)
        XCTAssertEqual(refused.status, 200)
        XCTAssertEqual(upstream.refusedBeforeBodyCount, 1)
        relay.signal(SIGTERM)
        let exitCode = relay.waitForExit(timeout: 90)
        let text = (try? String(contentsOf: report, encoding: .utf8)) ?? ""
        XCTAssertEqual(exitCode, 0, "valgrind found errors (exit 99) or the relay failed:\n\(text)")
        XCTAssertTrue(text.contains("ERROR SUMMARY: 0 errors"), String(text.suffix(6000)))
        XCTAssertGreaterThan(upstream.requests.count, 40)
    }
}

/// Teardown order by ownership: whatever registers with libevent keeps its `event_base` (the transport
/// loop) alive, so no release order at shutdown can free the base under a live event or listener.
final class LoopOwnershipTests: XCTestCase {
    func testEventsAndListenersKeepTheirLoopAlive() throws {
        var loop: EventLoop? = try EventLoop()
        weak var weakLoop = loop!.transport
        var event: LoopEvent? = LoopEvent(loop: loop!) { _ in }
        var listener: SmallHTTPServer? = try SmallHTTPServer(loop: loop!, host: "127.0.0.1", port: 0, limits: AdminServer.limits) { _, _ in }
        loop = nil
        XCTAssertNotNil(weakLoop, "an event or listener outlived its event_base")
        event = nil
        XCTAssertNotNil(weakLoop, "the listener outlived its event_base")
        listener = nil
        XCTAssertNil(weakLoop)
        _ = (event, listener)
    }
}
