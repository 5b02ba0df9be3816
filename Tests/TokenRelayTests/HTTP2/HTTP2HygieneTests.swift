import Foundation
import XCTest

/// The classic HTTP/2 attacks on the h2c port, with frames written by hand (`RawHTTP2Client`): each is
/// refused before anything reaches the HTTP/1.1 upstream, or ends the connection, and the relay goes on
/// serving.
final class HTTP2HygieneTests: RelayTestCase {
    private func startH2Relay(_ overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        try startRelay(overrides.merging(["data_plane": "transport"]) { $1 })
    }

    /// The relay still answers an ordinary HTTP/1.1 request afterwards.
    private func assertStillServing(_ relay: TokenRelayProcess, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(try? get(relay, "/after").status, 200, "the relay goes on serving", file: file, line: line)
    }

    /// A request refused on its stream (RST_STREAM PROTOCOL_ERROR), nothing forwarded.
    private func assertRefused(_ fields: [(String, String)], body: Data? = nil, file: StaticString = #filePath, line: UInt = #line) throws {
        let relay = try startH2Relay()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        try client.sendHeaders(stream: 1, fields, endStream: body == nil)
        if let body { try client.sendData(stream: 1, body, endStream: true) }
        let (frames, _) = client.readFrames { $0.type == RawHTTP2Client.rstStream || $0.type == RawHTTP2Client.goaway || $0.type == RawHTTP2Client.headers }
        let last = frames.last
        XCTAssertEqual(last?.type, RawHTTP2Client.rstStream, "frames: \(frames.map(\.type))", file: file, line: line)
        XCTAssertEqual(last?.errorCode, RawHTTP2Client.protocolError, file: file, line: line)
        XCTAssertEqual(api.requestCount, 0, "nothing reached the upstream", file: file, line: line)
        assertStillServing(relay, file: file, line: line)
    }

    func testAContentLengthTheDataDisagreesWithIsRefused() throws {
        try assertRefused(RawHTTP2Client.request("POST", "/upload", extra: [("content-length", "10")]), body: Data("12345".utf8))
    }

    func testMoreDataThanTheContentLengthIsRefused() throws {
        try assertRefused(RawHTTP2Client.request("POST", "/upload", extra: [("content-length", "3")]), body: Data("12345".utf8))
    }

    func testTransferEncodingIsRefused() throws {
        try assertRefused(RawHTTP2Client.request("POST", "/upload", extra: [("transfer-encoding", "chunked")]), body: Data("5\r\nhello\r\n0\r\n\r\n".utf8))
    }

    func testAConnectionSpecificFieldIsRefused() throws {
        try assertRefused(RawHTTP2Client.request(extra: [("connection", "keep-alive")]))
    }

    func testCRLFInAValueIsRefused() throws {
        try assertRefused(RawHTTP2Client.request(extra: [("x-note", "a\r\nx-injected: 1")]))
    }

    func testNULInAValueIsRefused() throws {
        try assertRefused(RawHTTP2Client.request(extra: [("x-note", "a\u{0}b")]))
    }

    func testAnUpperCaseNameIsRefused() throws {
        try assertRefused(RawHTTP2Client.request(extra: [("X-Note", "a")]))
    }

    func testAPseudoHeaderAfterARegularFieldIsRefused() throws {
        try assertRefused([(":method", "GET"), (":scheme", "http"), ("x-note", "a"), (":path", "/resource"), (":authority", "127.0.0.1")])
    }

    func testARepeatedPseudoHeaderIsRefused() throws {
        try assertRefused(RawHTTP2Client.request(extra: [(":path", "/other")]))
    }

    /// A header list over `limits.max_header_bytes` is answered 431 and not forwarded.
    func testAHeaderListOverTheLimitGets431() throws {
        let relay = try startH2Relay(["limits": ["max_header_bytes": 4096]])
        let big = String(repeating: "a", count: 6000)
        let result = try runTool("curl", ["-sS", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "--http2-prior-knowledge",
                                          "-H", "X-Big: \(big)", "\(relay.proxyURL)/resource"], timeout: 30)
        XCTAssertEqual(result.stdout, "431 2", result.stderr)
        XCTAssertEqual(api.requestCount, 0)
        assertStillServing(relay)
    }

    /// Rapid reset (CVE-2023-44487): streams opened and reset in a loop. Past the rate limit the
    /// connection ends with GOAWAY.
    func testRapidResetEndsTheConnection() throws {
        let relay = try startH2Relay()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        var burst = Data()
        for index in 0..<3000 {
            let stream = UInt32(2 * index + 1)
            burst.append(RawHTTP2Client.frame(RawHTTP2Client.headers, RawHTTP2Client.endHeaders | RawHTTP2Client.endStream, stream,
                                              RawHTTP2Client.block(RawHTTP2Client.request())))
            burst.append(RawHTTP2Client.frame(RawHTTP2Client.rstStream, 0, stream, Data([0, 0, 0, 8])))
        }
        try? client.write(burst)
        let (frames, ended) = client.readFrames()
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.goaway }, "GOAWAY")
        XCTAssertTrue(ended, "and the connection closed")
        XCTAssertLessThan(api.requestCount, 3000)
        assertStillServing(relay)
    }

    /// A HEADERS followed by CONTINUATION frames without end: past 8 the connection ends (nghttp2 treats it
    /// as fatal: the socket closes, with or without a GOAWAY).
    func testAContinuationFloodEndsTheConnection() throws {
        let relay = try startH2Relay()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        var flood = RawHTTP2Client.frame(RawHTTP2Client.headers, RawHTTP2Client.endStream, 1, RawHTTP2Client.block(RawHTTP2Client.request()))
        for _ in 0..<200 { flood.append(RawHTTP2Client.frame(RawHTTP2Client.continuation, 0, 1, RawHTTP2Client.block([("x-a", "b")]))) }
        try? client.write(flood)
        let (frames, ended) = client.readFrames()
        XCTAssertTrue(ended, "frames: \(frames.map(\.type))")
        XCTAssertFalse(frames.contains { $0.type == RawHTTP2Client.headers }, "never answered")
        XCTAssertEqual(api.requestCount, 0)
        assertStillServing(relay)
    }

    /// PINGs (and SETTINGS) whose acknowledgements the client never reads: the relay does not queue them
    /// without bound; the connection ends.
    func testAPingFloodThatIsNeverReadEndsTheConnection() throws {
        let relay = try startH2Relay(["timeouts": ["client_seconds": 2]])
        let client = try RawHTTP2Client(port: relay.proxyPort, receiveBuffer: 4096)
        let ping = RawHTTP2Client.frame(RawHTTP2Client.ping, 0, 0, Data(repeating: 7, count: 8))
        let settings = RawHTTP2Client.frame(RawHTTP2Client.settings, 0, 0, Data())
        var flood = Data()
        for index in 0..<400_000 { flood.append(index % 2 == 0 ? ping : settings) }
        try? client.write(flood)
        let (_, ended) = client.readFrames(limit: 1_000_000)
        XCTAssertTrue(ended, "the connection ended")
        assertStillServing(relay)
    }

    /// A SETTINGS frame with more entries than the limit ends the connection.
    func testASettingsFrameWithTooManyEntriesEndsTheConnection() throws {
        let relay = try startH2Relay()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        var payload = Data()
        for _ in 0..<100 { payload.append(contentsOf: [0, 3, 0, 0, 0, 100]) }
        try client.write(RawHTTP2Client.frame(RawHTTP2Client.settings, 0, 0, payload))
        let (frames, ended) = client.readFrames()
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.goaway }, "GOAWAY: \(frames.map(\.type))")
        XCTAssertTrue(ended)
    }

    /// A client that never opens its flow-control window holds the response: cut after
    /// `timeouts.client_seconds`.
    func testAZeroWindowStallIsCutAfterTheClientTimeout() throws {
        let relay = try startH2Relay(["timeouts": ["client_seconds": 1]])
        let client = try RawHTTP2Client(port: relay.proxyPort, timeout: 20, settings: [(4, 0)])   // INITIAL_WINDOW_SIZE 0
        try client.sendHeaders(stream: 1, RawHTTP2Client.request(), endStream: true)
        let started = Date()
        let (frames, ended) = client.readFrames()
        XCTAssertTrue(ended, "cut")
        XCTAssertLessThan(Date().timeIntervalSince(started), 10)
        XCTAssertFalse(frames.contains { $0.type == RawHTTP2Client.data && !$0.payload.isEmpty }, "no body went out")
        assertStillServing(relay)
    }

    /// `limits.max_concurrent_streams`: a client that has our SETTINGS and opens one stream more than they
    /// allow commits a protocol error (RFC 9113 §5.1.2): nghttp2 ends the connection with GOAWAY. The
    /// streams within the limit were forwarded.
    func testAStreamOverTheConcurrencyLimitEndsTheConnection() throws {
        let relay = try startH2Relay(["limits": ["max_concurrent_streams": 4]])
        let client = try RawHTTP2Client(port: relay.proxyPort)
        _ = client.readFrames { $0.type == RawHTTP2Client.settings && $0.flags & 1 == 0 }
        try client.write(RawHTTP2Client.frame(RawHTTP2Client.settings, 1, 0, Data()))   // ACK: the limit applies
        var burst = Data()
        for index in 0..<5 {
            // Bodies never sent: each stream stays open.
            burst.append(RawHTTP2Client.frame(RawHTTP2Client.headers, RawHTTP2Client.endHeaders, UInt32(2 * index + 1),
                                              RawHTTP2Client.block(RawHTTP2Client.request("POST", "/upload", extra: [("content-length", "1")]))))
        }
        try client.write(burst)
        let (frames, ended) = client.readFrames()
        let goaway = frames.first { $0.type == RawHTTP2Client.goaway }
        XCTAssertEqual(goaway?.errorCode, RawHTTP2Client.protocolError, "frames: \(frames.map(\.type))")
        XCTAssertTrue(ended)
        assertStillServing(relay)
    }

    /// The connection's window is opened to what every stream's window adds up to: a stream whose body is
    /// held (a refresh, a slow upstream) cannot use up the connection's 65,535 default and stall the others.
    func testTheConnectionWindowCoversEveryStreamsWindow() throws {
        let relay = try startH2Relay()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        let (frames, _) = client.readFrames(limit: 20) { $0.type == RawHTTP2Client.windowUpdate && $0.stream == 0 }
        let update = try XCTUnwrap(frames.last { $0.type == RawHTTP2Client.windowUpdate && $0.stream == 0 }, "frames: \(frames.map(\.type))")
        let bytes = [UInt8](update.payload)
        XCTAssertEqual(bytes.count, 4)
        let increment = (UInt32(bytes[0] & 0x7f) << 24) | (UInt32(bytes[1]) << 16) | (UInt32(bytes[2]) << 8) | UInt32(bytes[3])
        XCTAssertGreaterThanOrEqual(Int(increment) + 65_535, 100 * 256 * 1024, "the default 100 streams of 256 KiB each")
        assertStillServing(relay)
    }
}
