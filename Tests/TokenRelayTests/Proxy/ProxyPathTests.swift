import Foundation
import XCTest

final class ProxyPathTests: RelayTestCase {
    func testMethodsPathsAndQueriesAreForwarded() throws {
        let relay = try startRelay()
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            let body = method == "GET" || method == "OPTIONS" ? nil : Data("payload-\(method)".utf8)
            let response = try HTTPTestClient.send(port: relay.proxyPort, method: method, path: "/a/b?x=1&y=%20", body: body)
            XCTAssertEqual(response.status, 200, method)
            let seen = try XCTUnwrap(api.requests.last)
            XCTAssertEqual(seen.method, method)
            XCTAssertEqual(seen.target, "/a/b?x=1&y=%20")
            XCTAssertEqual(seen.body, body ?? Data())
        }
        let head = try HTTPTestClient.send(port: relay.proxyPort, method: "HEAD", path: "/head")
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.body, Data())
    }

    /// An upstream URL with a path of its own prefixes every target; without one (or "/") targets go up as
    /// they came. Dot segments are refused either way.
    func testUpstreamBasePathPrefixesTargets() throws {
        let based = try startRelay(["upstream": ["url": api.baseURL + "/base/"]])
        XCTAssertEqual(try get(based, "/a/b?x=1").status, 200)
        XCTAssertEqual(api.requests.last?.target, "/base/a/b?x=1")
        XCTAssertEqual(try get(based, "/a/../b").status, 400)
        let plain = try startRelay(["upstream": ["url": api.baseURL + "/"]])
        XCTAssertEqual(try get(plain, "/a/b?x=1").status, 200)
        XCTAssertEqual(api.requests.last?.target, "/a/b?x=1")
        XCTAssertEqual(try get(plain, "/a/%2e%2E/b").status, 400)
        XCTAssertEqual(api.requests.last?.target, "/a/b?x=1")
    }

    func testHopByHopHeadersAreStrippedAndHostIsTheUpstream() throws {
        let relay = try startRelay()
        _ = try get(relay, "/h", headers: [("Connection", "close, X-Private"), ("X-Private", "drop me"), ("Keep-Alive", "timeout=5"),
                                           ("Proxy-Authorization", "Basic eA=="), ("X-Custom", "kept"), ("Expect", "x-unknown")])
        let seen = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(seen.header("Host"), "127.0.0.1:\(api.port)")
        XCTAssertEqual(seen.header("X-Custom"), "kept")
        for dropped in ["X-Private", "Keep-Alive", "Proxy-Authorization", "Expect", "TE"] {
            XCTAssertNil(seen.header(dropped), dropped)
        }
    }

    func testResponseHeadersAndStatusesPassThrough() throws {
        let relay = try startRelay()
        api.responseOverride = { request in
            TestResponse(status: 418, reason: "I'm a teapot", headers: [("X-Upstream", "yes"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
                                                                          ("Keep-Alive", "timeout=5"), ("Proxy-Authenticate", "Basic")],
                         body: Data("short and stout".utf8))
        }
        let response = try get(relay)
        XCTAssertEqual(response.status, 418)
        XCTAssertEqual(response.header("X-Upstream"), "yes")
        XCTAssertEqual(response.headers(named: "Set-Cookie"), ["a=1", "b=2"])
        XCTAssertNil(response.header("Keep-Alive"))
        XCTAssertNil(response.header("Proxy-Authenticate"))
        XCTAssertEqual(response.bodyText, "short and stout")
        XCTAssertNil(response.header("Content-Type"), "tokenrelay must not invent a Content-Type")
    }

    func testKeepAliveOnBothSides() throws {
        let relay = try startRelay()
        let connection = try HTTPTestConnection(port: relay.proxyPort)
        defer { connection.close() }
        for i in 0..<20 {
            XCTAssertEqual(try connection.send(method: "GET", path: "/k/\(i)").status, 200)
        }
        XCTAssertLessThanOrEqual(api.acceptedConnections, 2, "upstream connections must be reused")
    }

    func testHTTP10ClientGetsCorrectFraming() throws {
        let relay = try startRelay()
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/old", headers: [("Connection", "keep-alive")],
                                               httpVersion: "HTTP/1.0")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.json()?["path"] as? String, "/old", response.bodyText)
    }

    func testLargeResponseIsStreamed() throws {
        let relay = try startRelay()
        let big = Data((0..<(4 * 1024 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 13) })
        api.responseOverride = { _ in TestResponse(status: 200, headers: [("Content-Type", "application/octet-stream")], body: big) }
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/big", timeout: 30)
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.body, big)
    }

    /// `data_plane: "evhttp"` named the engine of earlier releases: a config with it still loads (the key
    /// is a public contract), the transport carries the port, and a warning says so.
    func testAConfigNamingTheRetiredEngineStillRunsWithAWarning() throws {
        let relay = try startRelay(["data_plane": "evhttp"])
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertTrue(relay.stderrText.contains("is retired; the proxied port runs on the transport engine"), relay.stderrText)
    }

    func testUnreachableUpstreamGives502() throws {
        api.stop()
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 502)
    }

    func testStalledUpstreamGives504() throws {
        let relay = try startRelay(["timeouts": ["upstream_seconds": 0.5]])
        api.responseDelay = 5
        let started = Date()
        XCTAssertEqual(try get(relay).status, 504)
        XCTAssertLessThan(Date().timeIntervalSince(started), 4)
    }

    func testConnectIsRefused() throws {
        let relay = try startRelay()
        let raw = try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".utf8),
                                             timeout: 0.5)
        XCTAssertTrue(String(decoding: raw, as: UTF8.self).hasPrefix("HTTP/1.1 405"), String(decoding: raw, as: UTF8.self))
        XCTAssertEqual(api.requestCount, 0)
    }
}
