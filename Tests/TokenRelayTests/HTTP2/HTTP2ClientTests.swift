import Foundation
import XCTest

/// HTTP/2 with prior knowledge (h2c) on the proxied port, beside HTTP/1.1, to an HTTP/1.1 upstream:
/// each stream is a request with the same token injection, header rules and one-refresh-replay-once
/// path. Driven with curl `--http2-prior-knowledge` and nghttp (Debian's nghttp2-client).
final class HTTP2ClientTests: RelayTestCase {
    private func requireTools() throws {
        for tool in ["curl", "nghttp"] where !toolExists(tool) {
            throw XCTSkip("\(tool) is not installed (scripts/ensure-deps --test installs nghttp2-client)")
        }
    }

    private func startH2Relay(_ overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        try requireTools()
        return try startRelay(overrides.merging(["data_plane": "transport"]) { $1 })
    }

    /// `curl --http2-prior-knowledge`: status line, headers and body as curl prints them with `-i`.
    private func curlH2(_ relay: TokenRelayProcess, _ path: String, _ extra: [String] = []) throws -> ToolResult {
        try runTool("curl", ["-sS", "-i", "--http2-prior-knowledge", "--max-time", "20"] + extra + ["\(relay.proxyURL)\(path)"], timeout: 30)
    }

    func testCurlWithPriorKnowledgeGetsTheAPIsAnswerWithTheToken() throws {
        let relay = try startH2Relay()
        let result = try curlH2(relay, "/resource?x=1", ["-H", "Authorization: Bearer client-own", "-H", "X-Trace: abc"])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.hasPrefix("HTTP/2 200"), result.stdout)
        let seen = try XCTUnwrap(api.requests.first)
        XCTAssertEqual(seen.header("Authorization"), "Bearer \(tokenServer.currentAccessToken ?? "")", "the token, not the client's own")
        XCTAssertEqual(seen.header("X-Trace"), "abc")
        XCTAssertEqual(seen.target, "/resource?x=1")
        XCTAssertEqual(seen.version, "HTTP/1.1", "an HTTP/1.1 upstream")
        XCTAssertNotNil(seen.header("Host"), ":authority becomes Host")
    }

    /// HTTP/1.1 still works on the same port after HTTP/2 connections.
    func testHTTP1AndHTTP2ShareThePort() throws {
        let relay = try startH2Relay()
        XCTAssertTrue(try curlH2(relay, "/resource").stdout.hasPrefix("HTTP/2 200"))
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(api.requestCount, 2)
    }

    /// An uploaded body arrives whole, and a dead token is refreshed once and the request replayed.
    func testAPostAfterTheTokenDiedIsRefreshedOnceAndReplayed() throws {
        let relay = try startH2Relay()
        tokenServer.expireAccessTokens()
        let body = String(repeating: "0123456789", count: 5000)
        let result = try curlH2(relay, "/upload", ["-X", "POST", "--data-binary", body, "-H", "Content-Type: text/plain"])
        XCTAssertTrue(result.stdout.hasPrefix("HTTP/2 200"), result.stdout + result.stderr)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(api.requests.last.map { String(decoding: $0.body, as: UTF8.self) }, body)
    }

    /// 100 streams at once on one connection (nghttp -m 100): every one answered, one connection.
    func testAHundredConcurrentStreamsOnOneConnection() throws {
        let relay = try startH2Relay(["log": ["access": true]])
        let result = try runTool("nghttp", ["-n", "-s", "-m", "100", "\(relay.proxyURL)/resource"], timeout: 60)
        XCTAssertEqual(result.exitCode, 0, result.stdout + result.stderr)
        XCTAssertEqual(api.requestCount, 100)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.components(separatedBy: "msg=request ").count - 1 == 100 })
        XCTAssertEqual(relay.stderrText.components(separatedBy: "status=200").count - 1, 100)
    }

    /// A dead token under 50 concurrent streams: one refresh, every stream replayed once and answered.
    func testFiftyStreamsAfterTheTokenDiedShareOneRefresh() throws {
        let relay = try startH2Relay()
        tokenServer.expireAccessTokens()
        let result = try runTool("nghttp", ["-n", "-s", "-m", "50", "\(relay.proxyURL)/resource"], timeout: 60)
        XCTAssertEqual(result.exitCode, 0, result.stdout + result.stderr)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(api.requests.filter { $0.header("Authorization") == "Bearer \(tokenServer.currentAccessToken ?? "")" }.count, 50)
    }

    /// Hop-by-hop fields never reach the upstream (HTTP/2 forbids the connection-specific ones anyway),
    /// and the response's hop-by-hop fields never reach an HTTP/2 client.
    func testHeaderRulesAreThoseOfHTTP1() throws {
        let relay = try startH2Relay()
        let result = try curlH2(relay, "/resource", ["-H", "Proxy-Authorization: Basic c2VjcmV0", "-H", "Cookie: a=1", "-H", "Cookie: b=2"])
        XCTAssertTrue(result.stdout.hasPrefix("HTTP/2 200"), result.stdout)
        let seen = try XCTUnwrap(api.requests.first)
        XCTAssertNil(seen.header("Proxy-Authorization"))
        XCTAssertEqual(seen.headers(named: "Cookie").joined(separator: "; "), "a=1; b=2")
        XCTAssertFalse(result.stdout.lowercased().contains("connection:"), result.stdout)
        XCTAssertFalse(result.stdout.lowercased().contains("keep-alive:"), result.stdout)
    }

    /// A gRPC call cannot go to an HTTP/1.1 upstream: the client gets gRPC's UNAVAILABLE (14) with a
    /// message, as a Trailers-Only answer, and nothing reaches the upstream.
    func testAGRPCRequestToAnHTTP1UpstreamGetsUnavailable() throws {
        let relay = try startH2Relay()
        let result = try curlH2(relay, "/pkg.Service/Method", ["-X", "POST", "-H", "Content-Type: application/grpc", "-H", "TE: trailers",
                                                               "--data-binary", "@/dev/null"])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.hasPrefix("HTTP/2 200"), result.stdout)
        XCTAssertTrue(result.stdout.contains("grpc-status: 14"), result.stdout)
        XCTAssertTrue(result.stdout.contains("grpc-message: "), result.stdout)
        XCTAssertEqual(api.requestCount, 0)
    }

    /// RST_STREAM from the client while its request waits on the upstream: the upstream request is
    /// cancelled (its connection closed), the access log says 499, and the other streams go on.
    func testAResetStreamCancelsItsUpstreamRequest() throws {
        let heads = Locked<[RecordedRequest]>([])
        let arrived = TestSignal()
        let upstream = try RawUpstream { connection in
            guard let head = try connection.readHead() else { return }
            heads.withLock { $0.append(head) }
            if head.path == "/slow" {
                arrived.fire()
                _ = connection.waitForPeerClose(timeout: 20)
                heads.withLock { $0.append(RecordedRequest(method: "CLOSED", target: head.target, version: "", headers: [], body: Data(),
                                                          connectionID: connection.id, wasChunked: false)) }
                return
            }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        }
        defer { upstream.stop() }
        let relay = try startH2Relay(["log": ["access": true], "upstream": ["url": upstream.baseURL]])
        let client = try RawHTTP2Client(port: relay.proxyPort)
        try client.sendHeaders(stream: 1, RawHTTP2Client.request("GET", "/slow"), endStream: true)
        XCTAssertTrue(arrived.wait(timeout: 10), "the request reached the upstream")
        try client.sendReset(stream: 1)
        try client.sendHeaders(stream: 3, RawHTTP2Client.request("GET", "/fast"), endStream: true)
        let (frames, _) = client.readFrames { $0.type == RawHTTP2Client.data && $0.stream == 3 && $0.flags & RawHTTP2Client.endStream != 0 }
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.headers && $0.stream == 3 }, "the other stream is answered")
        XCTAssertFalse(frames.contains { $0.stream == 1 && $0.type == RawHTTP2Client.headers }, "the reset one is not")
        XCTAssertTrue(waitUntil(timeout: 10) { heads.withLock { $0.contains { $0.method == "CLOSED" } } }, "the upstream request was cancelled")
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("path=/slow") }, relay.stderrText)
        let line = relay.stderrText.split(separator: "\n").first { $0.contains("path=/slow") } ?? ""
        XCTAssertTrue(line.contains("status=499"), String(line))
    }

    /// A client's GOAWAY: the streams it opened before it are still answered, then the connection ends.
    func testAClientsGoawayLetsItsOpenStreamFinish() throws {
        let relay = try startH2Relay()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        var bytes = RawHTTP2Client.frame(RawHTTP2Client.headers, RawHTTP2Client.endHeaders | RawHTTP2Client.endStream, 1,
                                         RawHTTP2Client.block(RawHTTP2Client.request()))
        bytes.append(RawHTTP2Client.frame(RawHTTP2Client.goaway, 0, 0, Data([0, 0, 0, 0, 0, 0, 0, 0])))
        try client.write(bytes)
        let (frames, ended) = client.readFrames()
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.headers && $0.stream == 1 }, "answered: \(frames.map(\.type))")
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.data && $0.stream == 1 && $0.flags & RawHTTP2Client.endStream != 0 })
        XCTAssertTrue(ended, "then closed")
        XCTAssertEqual(api.requestCount, 1)
    }

    /// A real gRPC client (Python's grpcio, insecure channel) through tokenrelay to an HTTP/1.1 upstream:
    /// the call fails cleanly with UNAVAILABLE and a message saying why, not with a broken stream.
    func testAGRPCIOClientGetsUnavailableFromAnHTTP1Upstream() throws {
        let relay = try startH2Relay()
        // Debian's python3-grpcio is for the system's python3, which may not be the first on PATH.
        guard let python = ["/usr/bin/python3", "python3"].first(where: { (try? runTool($0, ["-c", "import grpc"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 grpcio is not installed (scripts/ensure-deps --test installs python3-grpcio)")
        }
        let script = testFixtures.appendingPathComponent("grpc_call.py")
        let result = try runTool(python, [script.path, String(relay.proxyPort), "/pkg.Service/Method"], timeout: 60)
        let outcome = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], result.stdout + result.stderr)
        XCTAssertEqual(outcome["code"] as? String, "UNAVAILABLE", result.stdout)
        XCTAssertTrue((outcome["details"] as? String ?? "").contains("HTTP/2"), result.stdout)
        XCTAssertEqual(api.requestCount, 0)
    }

    /// Shutdown: an HTTP/2 client gets GOAWAY, its stream in flight is still answered, then the
    /// connection closes and the relay exits cleanly.
    func testShutdownSendsGoawayAndFinishesTheStreamsInFlight() throws {
        let arrived = TestSignal(), release = TestSignal()
        let upstream = try RawUpstream { connection in
            guard try connection.readHead() != nil else { return }
            arrived.fire()
            _ = release.wait(timeout: 20)
            try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
        }
        defer { upstream.stop() }
        let relay = try startH2Relay(["upstream": ["url": upstream.baseURL], "timeouts": ["drain_seconds": 20]])
        let client = try RawHTTP2Client(port: relay.proxyPort, timeout: 20)
        try client.sendHeaders(stream: 1, RawHTTP2Client.request("GET", "/slow"), endStream: true)
        XCTAssertTrue(arrived.wait(timeout: 10))
        relay.signal(SIGTERM)
        let (early, _) = client.readFrames { $0.type == RawHTTP2Client.goaway }
        XCTAssertEqual(early.last?.type, RawHTTP2Client.goaway, "GOAWAY at once")
        release.fire()
        let (frames, ended) = client.readFrames()
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.headers && $0.stream == 1 }, "frames: \(frames.map(\.type))")
        XCTAssertTrue(frames.contains { $0.type == RawHTTP2Client.data && $0.stream == 1 && $0.payload == Data("done".utf8) })
        XCTAssertTrue(ended)
        XCTAssertEqual(relay.waitForExit(timeout: 20), 0)
    }

    /// A body over `limits.max_body_bytes` is streamed from the HTTP/2 stream to the upstream (flow control
    /// holds the client back), and a large response comes back whole.
    func testALargeUploadIsStreamedAndALargeResponseRelayedWhole() throws {
        let relay = try startH2Relay(["limits": ["max_body_bytes": 1 << 20]])
        let body = Data((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ ($0 >> 13)) })
        let file = makeTemporaryDirectory(prefix: "h2-upload").appendingPathComponent("body")
        try body.write(to: file)
        api.responseOverride = { request in
            request.path == "/upload" ? .json(200, ["received": request.body.count]) : nil
        }
        let upload = try curlH2(relay, "/upload", ["-X", "POST", "--data-binary", "@\(file.path)", "-H", "Content-Type: application/octet-stream"])
        XCTAssertTrue(upload.stdout.contains("HTTP/2 200"), upload.stdout + upload.stderr)   // after curl's own "HTTP/2 100"
        XCTAssertTrue(api.requests.last?.body == body, "the body arrived altered (\(api.requests.last?.body.count ?? 0) bytes)")

        let big = String(repeating: "0123456789abcdef", count: (8 << 20) / 16)
        let bigBody = Data(big.utf8)
        api.responseOverride = { request in request.path == "/big" ? TestResponse(status: 200, headers: [("Content-Type", "text/plain")], body: bigBody) : nil }
        let out = file.deletingLastPathComponent().appendingPathComponent("big")
        let download = try runTool("curl", ["-sS", "--http2-prior-knowledge", "--max-time", "30", "-o", out.path, "-w", "%{http_code} %{size_download}",
                                            "\(relay.proxyURL)/big"], timeout: 40)
        XCTAssertEqual(download.stdout, "200 \(big.utf8.count)", download.stderr)
        XCTAssertEqual(try Data(contentsOf: out), Data(big.utf8))
    }
}
