import Foundation
import XCTest
@testable import TokenRelay

/// `upstream.http2`: requests go to an HTTP/2 upstream (the Python h2 fixture), from HTTP/1.1 and h2c
/// clients alike, multiplexed on few connections within the server's SETTINGS_MAX_CONCURRENT_STREAMS,
/// with GOAWAY, a 401 refresh and gRPC passed through.
final class HTTP2UpstreamTests: RelayTestCase {
    private var h2: H2Upstream!

    override func tearDownWithError() throws {
        h2?.stop()
        try super.tearDownWithError()
    }

    private func requireTools() throws {
        for tool in ["curl", "nghttp"] where !toolExists(tool) {
            throw XCTSkip("\(tool) is not installed (scripts/ensure-deps --test installs nghttp2-client)")
        }
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
    }

    private func startWithH2Upstream(_ upstream: [String: Any] = [:], _ overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        try requireTools()
        h2 = try H2Upstream(workDir: workDir, settings: upstream)
        return try startRelay(overrides.merging(["data_plane": "transport",
                                                 "upstream": ["url": h2.url, "http2": "prior_knowledge"]]) { $1 })
    }

    private func curlH2(_ relay: TokenRelayProcess, _ path: String, _ extra: [String] = []) throws -> ToolResult {
        try runTool("curl", ["-sS", "-i", "--http2-prior-knowledge", "--max-time", "20"] + extra + ["\(relay.proxyURL)\(path)"], timeout: 30)
    }

    private var token: String { tokenServer.currentAccessToken ?? "" }

    func testCurlWithPriorKnowledgeReachesAnH2cUpstreamWithTheToken() throws {
        let relay = try startWithH2Upstream()
        let result = try curlH2(relay, "/resource?x=1", ["-H", "Authorization: Bearer client-own", "-H", "X-Trace: abc"])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.hasPrefix("HTTP/2 200"), result.stdout)
        XCTAssertTrue(result.stdout.contains("ok /resource?x=1 0"), result.stdout)
        let seen = try XCTUnwrap(h2.requests.first)
        XCTAssertEqual(seen.field("authorization"), "Bearer \(token)", "the token, not the client's own")
        XCTAssertEqual(seen.field("x-trace"), "abc")
        XCTAssertEqual(seen.field(":authority"), "127.0.0.1:\(h2.port)", "Host mapped to :authority")
        XCTAssertEqual(seen.field(":scheme"), "http")
        XCTAssertNil(seen.field("host"))
    }

    func testAnHTTP1ClientReachesAnH2cUpstreamAndHopByHopFieldsAreDropped() throws {
        let relay = try startWithH2Upstream()
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload",
                                               headers: [("Connection", "keep-alive, X-Drop"), ("X-Drop", "1"), ("Keep-Alive", "timeout=5"),
                                                         ("TE", "gzip"), ("Content-Type", "text/plain")], body: Data("hello h2".utf8))
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.reason, "OK", "HTTP/2 has no reason phrase; h2load --h1 counts an empty one as a failure")
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "ok /upload 8\n")
        let seen = try XCTUnwrap(h2.requests.first)
        XCTAssertEqual(seen.field(":method"), "POST")
        XCTAssertEqual(seen.field("authorization"), "Bearer \(token)")
        for name in ["connection", "keep-alive", "x-drop", "te", "transfer-encoding", "upgrade"] {
            XCTAssertNil(seen.field(name), "\(name) must not reach an HTTP/2 upstream")
        }
        XCTAssertEqual(seen.bodyBytes, 8)
    }

    /// 100 concurrent streams from one h2c client go upstream as streams of few connections (the server
    /// allows 100 per connection): multiplexed, not a connection each.
    func testAHundredConcurrentStreamsShareFewUpstreamConnections() throws {
        let relay = try startWithH2Upstream(["delay_ms": 20])
        let uris = (1...100).map { "\(relay.proxyURL)/r/\($0)" }
        let result = try runTool("nghttp", ["-n", "-s"] + uris, timeout: 60)
        XCTAssertEqual(result.exitCode, 0, result.stdout + result.stderr)
        XCTAssertEqual(Set(h2.requests.map(\.path)).count, 100)
        XCTAssertEqual(h2.requests.count, 100)
        XCTAssertLessThanOrEqual(h2.connectionCount, 2, "streams multiplexed on few connections")
    }

    /// The server allows 2 streams per connection: the pool opens more connections, every request answered.
    func testASmallMaxConcurrentStreamsOpensMoreConnections() throws {
        let relay = try startWithH2Upstream(["max_concurrent_streams": 2, "delay_ms": 50])
        let uris = (1...20).map { "\(relay.proxyURL)/r/\($0)" }
        let result = try runTool("nghttp", ["-n", "-s"] + uris, timeout: 60)
        XCTAssertEqual(result.exitCode, 0, result.stdout + result.stderr)
        XCTAssertEqual(Set(h2.requests.map(\.path)).count, 20)
        XCTAssertGreaterThan(h2.connectionCount, 1, "beyond 2 streams a new connection")
        // No connection ever carried more than 2 streams at once is the server's own rule (it would reset
        // a third); every request went through, and none twice.
        XCTAssertEqual(h2.requests.count, 20)
    }

    /// A server that allows no stream at all (SETTINGS_MAX_CONCURRENT_STREAMS 0): the request waits on
    /// the one connection for its pool wait and gets 503; it used to open a connection per pump, up to
    /// `limits.max_upstream_connections` for one request (found by the HTTP/2 probe).
    func testAServerAllowingNoStreamsGetsOneConnectionNotOnePerAttempt() throws {
        let relay = try startWithH2Upstream(["max_concurrent_streams": 0], ["timeouts": ["pool_wait_seconds": 1]])
        let response = try get(relay, "/refused")
        XCTAssertEqual(response.status, 503, response.bodyText)
        XCTAssertEqual(h2.requests.count, 0)
        XCTAssertLessThanOrEqual(h2.connectionCount, 2, "one connection (and at most one retry's), not one per attempt")
    }

    /// GOAWAY from the upstream after 10 of 50 requests: the ones it did not process go again on a new
    /// connection; every request answered 200, each processed exactly once.
    func testGoawayMidBurstLosesNothing() throws {
        let relay = try startWithH2Upstream(["goaway_after": 10, "delay_ms": 20], ["log": ["access": true]])
        let uris = (1...50).map { "\(relay.proxyURL)/r/\($0)" }
        let result = try runTool("nghttp", ["-n", "-s"] + uris, timeout: 60)
        XCTAssertEqual(result.exitCode, 0, result.stdout + result.stderr)
        let paths = h2.requests.map(\.path)
        XCTAssertEqual(Set(paths).count, 50, "every request reached the upstream")
        XCTAssertEqual(paths.count, 50, "none processed twice")
        XCTAssertEqual(h2.requests.filter { $0.connection == 1 }.count, 10, "the first connection processed what its GOAWAY said")
        XCTAssertGreaterThan(h2.connectionCount, 1)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.components(separatedBy: "status=200").count - 1 == 50 }, relay.stderrText)
    }

    /// An h2 upstream's 401 for a dead token: one refresh, the request replayed with the new token.
    func testAnExpiredTokenOnAnH2UpstreamIsRefreshedOnceAndReplayed() throws {
        let relay = try startWithH2Upstream()
        let old = token
        try h2.reject([old])
        let response = try get(relay, "/resource")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(h2.requests.map { $0.field("authorization") }, ["Bearer \(old)", "Bearer \(token)"])
        XCTAssertNotEqual(old, token)
    }

    /// A gRPC call (grpcio, insecure channel) through tokenrelay to an h2c upstream: passed through with the
    /// token and `te: trailers`, the reply and the trailers (grpc-status 0) back to the client.
    func testAGRPCCallIsPassedToAnH2Upstream() throws {
        let relay = try startWithH2Upstream()
        guard let python = ["/usr/bin/python3", "python3"].first(where: { (try? runTool($0, ["-c", "import grpc"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 grpcio is not installed (scripts/ensure-deps --test installs python3-grpcio)")
        }
        let script = testFixtures.appendingPathComponent("grpc_call.py")
        let result = try runTool(python, [script.path, String(relay.proxyPort), "/pkg.Service/Method"], timeout: 60)
        let outcome = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], result.stdout + result.stderr)
        XCTAssertEqual(outcome["code"] as? String, "OK", result.stdout)
        XCTAssertEqual(outcome["reply"] as? String, "0801", "the message echoed")
        let seen = try XCTUnwrap(h2.requests.first)
        XCTAssertEqual(seen.field("te"), "trailers")
        XCTAssertEqual(seen.field("authorization"), "Bearer \(token)")
    }

    /// A gRPC call whose token the upstream refuses (Trailers-Only grpc-status 16): one refresh, the call
    /// replayed with the new token, and the client sees OK.
    func testAGRPCUnauthenticatedFromAnH2UpstreamIsRefreshedOnceAndReplayed() throws {
        let relay = try startWithH2Upstream()
        guard let python = ["/usr/bin/python3", "python3"].first(where: { (try? runTool($0, ["-c", "import grpc"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 grpcio is not installed (scripts/ensure-deps --test installs python3-grpcio)")
        }
        let old = token
        try h2.reject([old])
        let script = testFixtures.appendingPathComponent("grpc_call.py")
        let result = try runTool(python, [script.path, String(relay.proxyPort), "/pkg.Service/Method"], timeout: 60)
        let outcome = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], result.stdout + result.stderr)
        XCTAssertEqual(outcome["code"] as? String, "OK", result.stdout)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(h2.requests.map { $0.field("authorization") }, ["Bearer \(old)", "Bearer \(token)"])
    }

    /// Trailers from the upstream reach an h2 client (curl prints them after the body).
    func testResponseTrailersReachAnH2Client() throws {
        let relay = try startWithH2Upstream()
        var frame: [UInt8] = [0, 0, 0, 0, 2, 8, 1]
        let body = Data(frame)
        frame = []
        let bodyFile = workDir.appendingPathComponent("grpc-body")
        try body.write(to: bodyFile)
        let result = try curlH2(relay, "/pkg.Service/Method", ["-X", "POST", "-H", "Content-Type: application/grpc", "-H", "TE: trailers",
                                                               "--data-binary", "@\(bodyFile.path)"])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.hasPrefix("HTTP/2 200"), result.stdout)
        XCTAssertTrue(result.stdout.contains("grpc-status: 0"), result.stdout)
        XCTAssertTrue(result.stdout.contains("x-trailer: seen"), result.stdout)
    }

    /// Request trailers from an h2 client reach the h2 upstream after the body.
    func testRequestTrailersReachAnH2Upstream() throws {
        let relay = try startWithH2Upstream()
        let client = try RawHTTP2Client(port: relay.proxyPort)
        try client.sendHeaders(stream: 1, RawHTTP2Client.request("POST", "/with-trailers", extra: [("content-type", "text/plain")]), endStream: false)
        try client.sendData(stream: 1, Data("hello".utf8), endStream: false)
        try client.sendHeaders(stream: 1, [("x-checksum", "abc123")], endStream: true)
        let read = client.readFrames { $0.stream == 1 && $0.flags & RawHTTP2Client.endStream != 0 }
        XCTAssertFalse(read.ended, "the answer came on an open connection")
        let seen = try XCTUnwrap(h2.requests.first)
        XCTAssertEqual(seen.bodyBytes, 5)
        XCTAssertEqual(seen.trailers.map { "\($0.name): \($0.value)" }, ["x-checksum: abc123"])
    }

    /// Bodies over `limits.max_body_bytes` are streamed to an h2 upstream, from an HTTP/1.1 client and from
    /// an h2c one (flow control on both streams holds the client back instead of buffering).
    func testAStreamedUploadReachesAnH2UpstreamWhole() throws {
        let relay = try startWithH2Upstream([:], ["limits": ["max_body_bytes": 65536]])
        let file = workDir.appendingPathComponent("upload.bin")
        try Data(repeating: 0x61, count: 3 * 1024 * 1024).write(to: file)
        let h1 = try runTool("curl", ["-sS", "--max-time", "30", "-X", "POST", "--data-binary", "@\(file.path)", "\(relay.proxyURL)/up1"], timeout: 40)
        XCTAssertEqual(h1.stdout, "ok /up1 3145728\n", h1.stderr)
        let h2c = try curlH2(relay, "/up2", ["-X", "POST", "--data-binary", "@\(file.path)"])
        XCTAssertTrue(h2c.stdout.hasSuffix("ok /up2 3145728\n"), h2c.stdout + h2c.stderr)
        XCTAssertEqual(h2.requests.map(\.bodyBytes), [3145728, 3145728])
    }

    /// An h2 upstream that goes silent mid-body is cut after `timeouts.stream_idle_seconds`, as an HTTP/1.1
    /// one is: the client gets a truncated response, not a hang; the connection's other streams go on.
    func testASilentStreamIsCutAfterStreamIdleSeconds() throws {
        let relay = try startWithH2Upstream(["stall_paths": ["/stall"]], ["timeouts": ["stream_idle_seconds": 1], "log": ["access": true]])
        let started = Date()
        let cut = try runTool("curl", ["-sS", "--max-time", "20", "\(relay.proxyURL)/stall"], timeout: 30)
        XCTAssertNotEqual(cut.exitCode, 0, "a truncated response")
        XCTAssertNotEqual(cut.exitCode, 28, "cut by the relay, not by curl's own limit")
        XCTAssertLessThan(Date().timeIntervalSince(started), 15)
        XCTAssertEqual(try get(relay, "/after").status, 200, "the upstream connection still serves")
        XCTAssertEqual(h2.connectionCount, 1)
    }

    /// An h2 upstream that cannot be reached: the request gets 502 at once (its connect failure reaches the
    /// request machine as on HTTP/1.1: retried once, then answered), not a 503 after the pool wait.
    func testAnUnreachableH2UpstreamAnswers502AtOnce() throws {
        let relay = try startWithH2Upstream()
        h2.stop()
        for _ in 0..<2 {
            let started = Date()
            XCTAssertEqual(try get(relay, "/down").status, 502)
            XCTAssertLessThan(Date().timeIntervalSince(started), 5, "not the pool wait's 503 after 10 s")
        }
        XCTAssertTrue(relay.stderrText.contains("could not connect"), relay.stderrText)
    }

    /// The upstream URL's base path applies as on HTTP/1.1: `:path` is the base path plus the request's.
    func testTheBasePathRulesApplyToAnH2Upstream() throws {
        try requireTools()
        h2 = try H2Upstream(workDir: workDir)
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": h2.url + "/v1", "http2": "prior_knowledge"]])
        let response = try get(relay, "/items?q=1")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(h2.requests.first?.path, "/v1/items?q=1")
        XCTAssertEqual(h2.requests.first?.field(":authority"), "127.0.0.1:\(h2.port)")
    }

    /// With `upstream.http2` "never" (the default) a gRPC request still gets UNAVAILABLE at once.
    func testGRPCStillGetsUnavailableWhenTheUpstreamIsHTTP1() throws {
        try requireTools()
        let relay = try startRelay(["data_plane": "transport"])
        let result = try curlH2(relay, "/pkg.Service/Method", ["-X", "POST", "-H", "Content-Type: application/grpc", "-H", "TE: trailers", "--data-binary", "x"])
        XCTAssertTrue(result.stdout.contains("grpc-status: 14"), result.stdout)
        XCTAssertEqual(api.requestCount, 0)
    }

    // MARK: - ALPN (h2 over TLS)

    /// A self-signed certificate for 127.0.0.1 (the relay trusts it through `tls.ca_file`).
    private func makeCertificate() throws -> (cert: String, key: String) {
        let cert = workDir.appendingPathComponent("h2-cert.pem").path, key = workDir.appendingPathComponent("h2-key.pem").path
        let made = try runTool("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                                           "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                                           "-addext", "subjectAltName=IP:127.0.0.1"], timeout: 30)
        XCTAssertEqual(made.exitCode, 0, made.stderr)
        return (cert, key)
    }

    private func startWithTLSUpstream(alpnHTTP11Only: Bool) throws -> TokenRelayProcess {
        try requireTools()
        let (cert, key) = try makeCertificate()
        h2 = try H2Upstream(workDir: workDir, settings: ["cert_file": cert, "key_file": key, "alpn_http11_only": alpnHTTP11Only])
        return try startRelay(["data_plane": "transport",
                               "upstream": ["url": "https://127.0.0.1:\(h2.port)", "http2": "alpn", "tls": ["ca_file": cert]]])
    }

    /// "alpn" against a TLS server that selects h2: the requests go as HTTP/2 streams over TLS.
    func testALPNSpeaksH2WhenTheServerSelectsIt() throws {
        let relay = try startWithTLSUpstream(alpnHTTP11Only: false)
        for _ in 0..<2 {
            let response = try get(relay, "/resource")
            XCTAssertEqual(response.status, 200)
            XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "ok /resource 0\n")
        }
        XCTAssertEqual(h2.requests.count, 2)
        XCTAssertEqual(h2.requests.first?.field(":scheme"), "https")
        XCTAssertEqual(h2.requests.first?.field("authorization"), "Bearer \(token)")
        XCTAssertEqual(h2.connectionCount, 1, "both requests on one h2 connection")
    }

    /// "alpn" against a TLS server that offers only http/1.1: the requests go over HTTP/1.1, and keep doing so.
    func testALPNFallsBackToHTTP1WhenTheServerSelectsIt() throws {
        let relay = try startWithTLSUpstream(alpnHTTP11Only: true)
        for _ in 0..<2 {
            let response = try get(relay, "/resource")
            XCTAssertEqual(response.status, 200)
            XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "http/1.1\n")
        }
        XCTAssertEqual(h2.requests.count, 0, "no HTTP/2 request reached it")
    }

    /// RST_STREAM from the upstream ends that stream only: the other streams on the connection are answered.
    /// A response our nghttp2 refuses (a connection-specific field) is reset by tokenrelay, and the 502 and
    /// the log say so: not "reset by the upstream", which sent no RST_STREAM.
    func testAnInvalidResponseIsNamedAsSuchNotAsTheUpstreamsReset() throws {
        let relay = try startWithH2Upstream(["invalid_field_paths": ["/bad"]])
        let response = try get(relay, "/bad")
        XCTAssertEqual(response.status, 502)
        XCTAssertTrue(response.bodyText.contains("invalid HTTP/2 response ("), response.bodyText)
        XCTAssertFalse(response.bodyText.contains("reset by the upstream"), response.bodyText)
        XCTAssertEqual(try get(relay, "/good").status, 200, "the connection's other streams go on")
    }

    /// A connection error (a malformed frame) from a server that then keeps the connection open: the
    /// request is answered at once, not when the socket's 2-s lingering close ends.
    func testAConnectionErrorAnswersItsStreamsWithoutWaitingForTheClose() throws {
        let relay = try startWithH2Upstream(["broken_frame_paths": ["/broken"]])
        let start = Date()
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/broken", body: Data("x".utf8))
        let elapsed = Date().timeIntervalSince(start)
        XCTAssertEqual(response.status, 502)
        XCTAssertLessThan(elapsed, 1.8, "answered when the linger ended (2 s), not at the connection error")
        XCTAssertEqual(try get(relay, "/good").status, 200, "a new connection serves the next request")
    }

    /// A small header block that HPACK decodes into megabytes (one big table entry referenced 10,000
    /// times) is refused as it grows over the head limit, not after all of it was decoded and kept.
    func testAResponseHeaderListOverTheLimitIsRefusedWhileDecoded() throws {
        let relay = try startWithH2Upstream(["hpack_bomb_paths": ["/bomb"]])
        let response = try get(relay, "/bomb")
        XCTAssertEqual(response.status, 502)
        XCTAssertTrue(response.bodyText.contains("response header list over"), response.bodyText)
        XCTAssertEqual(try get(relay, "/good").status, 200, "the connection's other streams go on")
    }

    func testAnUpstreamResetEndsThatStreamOnly() throws {
        let relay = try startWithH2Upstream(["reset_paths": ["/reset"], "delay_ms": 50], ["log": ["access": true]])
        let uris = ["/a", "/reset", "/b", "/c"].map { "\(relay.proxyURL)\($0)" }
        _ = try runTool("nghttp", ["-n", "-s"] + uris, timeout: 60)
        XCTAssertEqual(Set(h2.requests.map(\.path)), ["/a", "/b", "/c"])
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.components(separatedBy: "msg=request ").count - 1 == 4 }, relay.stderrText)
        let log = relay.stderrText
        XCTAssertEqual(log.components(separatedBy: "status=200").count - 1, 3, log)
        XCTAssertEqual(log.components(separatedBy: "status=502").count - 1, 1, log)
        XCTAssertEqual(h2.connectionCount, 1, "the connection outlived the reset")
    }
}


/// `upstream.http2` in the configuration: its three values, and a bad one named in one line.
final class HTTP2UpstreamConfigTests: XCTestCase {
    private func parse(_ upstream: [String: Any]) throws -> Config {
        let object: [String: Any] = [
            "listen": "127.0.0.1:8080", "upstream": upstream, "tokens": ["file": "/tmp/tokens.json"],
            "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/t", "client_id": "a",
                        "client_secret_env": "S", "client_auth": "client_secret_basic"],
        ]
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    func testValuesAndDefault() throws {
        XCTAssertEqual(try parse(["url": "http://127.0.0.1:9000"]).upstream.http2, .never)
        XCTAssertEqual(try parse(["url": "http://127.0.0.1:9000", "http2": "prior_knowledge"]).upstream.http2, .priorKnowledge)
        XCTAssertEqual(try parse(["url": "http://127.0.0.1:9000", "http2": "never"]).upstream.http2, .never)
        XCTAssertEqual(try parse(["url": "https://api.example.com", "http2": "alpn"]).upstream.http2, .alpn)
    }

    func testABadValueIsNamedInOneLine() {
        XCTAssertThrowsError(try parse(["url": "http://127.0.0.1:9000", "http2": "always"])) { error in
            let text = (error as? ConfigError)?.description ?? ""
            XCTAssertTrue(text.hasPrefix("upstream.http2: must be one of"), text)
            XCTAssertFalse(text.contains("\n"))
        }
        XCTAssertThrowsError(try parse(["url": "http://127.0.0.1:9000", "http2": "alpn"])) { error in
            XCTAssertTrue(((error as? ConfigError)?.description ?? "").hasPrefix("upstream.http2:"))
        }
    }
}
