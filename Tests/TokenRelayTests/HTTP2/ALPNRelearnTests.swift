import Foundation
import XCTest

/// `upstream.http2` "alpn" learns what the server selects at each new TLS connection, not once per pool:
/// an upstream redeployed from HTTP/1.1-only to h2 (or back) is spoken to in its new protocol without a
/// reload. The Python h2 fixture reads what it selects from a file at each connection (`alpn_file`).
final class ALPNRelearnTests: RelayTestCase {
    private var h2: H2Upstream?
    private var modeFile: URL { workDir.appendingPathComponent("alpn-mode") }

    override func tearDownWithError() throws {
        h2?.stop()
        try super.tearDownWithError()
    }

    private func setMode(_ mode: String) throws { try mode.write(to: modeFile, atomically: true, encoding: .utf8) }

    private func start(mode: String) throws -> TokenRelayProcess {
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
        let cert = workDir.appendingPathComponent("alpn-cert.pem").path, key = workDir.appendingPathComponent("alpn-key.pem").path
        let made = try runTool("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                                           "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                                           "-addext", "subjectAltName=IP:127.0.0.1"], timeout: 30)
        XCTAssertEqual(made.exitCode, 0, made.stderr)
        try setMode(mode)
        let upstream = try H2Upstream(workDir: workDir, settings: ["cert_file": cert, "key_file": key, "alpn_file": modeFile.path])
        h2 = upstream
        return try startRelay(["data_plane": "transport",
                               "upstream": ["url": "https://127.0.0.1:\(upstream.port)", "http2": "alpn", "tls": ["ca_file": cert]]])
    }

    /// The body says which protocol answered: "ok /path 0" from HTTP/2, "http/1.1" from the HTTP/1.1 server.
    private func answer(_ relay: TokenRelayProcess, _ path: String) throws -> String {
        let response = try get(relay, path)
        XCTAssertEqual(response.status, 200, relay.stderrText.suffix(800).description)
        return String(decoding: response.body, as: UTF8.self)
    }

    func testAnUpstreamRedeployedBetweenHTTP1AndH2IsFollowedWithoutAReload() throws {
        let relay = try start(mode: "http/1.1")
        XCTAssertEqual(try answer(relay, "/one"), "http/1.1\n")
        XCTAssertEqual(h2?.requests.count, 0)

        // Redeployed with h2: the next connection (the HTTP/1.1 server closes each one) finds h2 selected.
        try setMode("h2")
        XCTAssertEqual(try answer(relay, "/two"), "ok /two 0\n", "spoken to over HTTP/2 again")
        XCTAssertEqual(try answer(relay, "/three"), "ok /three 0\n")
        XCTAssertEqual(h2?.requests.map(\.path), ["/two", "/three"], "each request processed once")

        // And back: the h2 connection goes away (GOAWAY, the request unprocessed), the next one learns HTTP/1.1.
        try setMode("http/1.1")
        XCTAssertEqual(try answer(relay, "/four"), "http/1.1\n")
        try setMode("h2")
        XCTAssertEqual(try answer(relay, "/five"), "ok /five 0\n")
        XCTAssertEqual(h2?.requests.map(\.path), ["/two", "/three", "/five"])
    }

    /// A client that sends only gRPC opens no HTTP/1.1 connection to learn from: its calls ask the server
    /// again (at most once a second), so they get through once the upstream speaks h2.
    func testGRPCCallsAskAgainAfterTheUpstreamMovedToH2() throws {
        let relay = try start(mode: "http/1.1")
        XCTAssertEqual(try answer(relay, "/learn"), "http/1.1\n", "the pool has learnt HTTP/1.1")
        guard let python = ["/usr/bin/python3", "python3"].first(where: { (try? runTool($0, ["-c", "import grpc"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 grpcio is not installed (scripts/ensure-deps --test installs python3-grpcio)")
        }
        let script = testFixtures.appendingPathComponent("grpc_call.py")
        func call() throws -> String {
            let result = try runTool(python, [script.path, String(relay.proxyPort), "/pkg.Service/Method"], timeout: 60)
            let outcome = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
            return outcome?["code"] as? String ?? result.stdout + result.stderr
        }
        XCTAssertEqual(try call(), "UNAVAILABLE", "HTTP/1.1 cannot carry it")
        try setMode("h2")
        var last = ""
        XCTAssertTrue(waitUntil(timeout: 15, interval: 0.2) { last = (try? call()) ?? ""; return last == "OK" }, "last call: \(last)")
        XCTAssertEqual(h2?.requests.last?.path, "/pkg.Service/Method")
    }
}
