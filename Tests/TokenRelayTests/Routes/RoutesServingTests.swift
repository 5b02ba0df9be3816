import Foundation
import XCTest

/// Routes on the main listener, served end to end: each request reaches its route's upstream (path
/// prefix with strip_prefix, Host), the token of the (top-level) identity injected under the route's header,
/// one refresh however many routes' requests find the token dead, and a reload adding a route under load.
final class RoutesServingTests: ReloadTestCase {
    private var hrAPI: FakeAPIServer!
    private var docsAPI: FakeAPIServer!

    override func setUpWithError() throws {
        try super.setUpWithError()
        hrAPI = try secondAPI()
        // The route changes the header's name only: its value keeps the top-level format (Bearer).
        let tokens = tokenServer!
        docsAPI = stoppedInTearDown(try FakeAPIServer(validateToken: { value in
            value.hasPrefix("Bearer ") && tokens.isAccessTokenValid(String(value.dropFirst("Bearer ".count)))
        }, tokenHeader: "X-Docs-Token"))
    }

    private var routes: [[String: Any]] {
        [["name": "hr", "match": ["path_prefix": "/hr/", "strip_prefix": true], "upstream": ["url": hrAPI.baseURL]],
         ["name": "docs", "match": ["host": "docs.test"], "upstream": ["url": docsAPI.baseURL], "inject": ["header": "X-Docs-Token"]]]
    }

    private func fetchVia(_ relay: TokenRelayProcess, _ path: String, host: String? = nil) throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: path, headers: host.map { [("Host", $0)] } ?? [])
    }

    func testEachRouteReachesItsUpstream() throws {
        let relay = try startRelay(["routes": routes])
        XCTAssertEqual(try fetchVia(relay, "/hr/people?page=2").status, 200)
        XCTAssertEqual(try fetchVia(relay, "/hr/").status, 200)
        XCTAssertEqual(try fetchVia(relay, "/docs/a", host: "DOCS.test:8080").status, 200)
        XCTAssertEqual(try fetchVia(relay, "/hrx").status, 200)
        XCTAssertEqual(hrAPI.requests.map(\.target), ["/people?page=2", "/"])
        XCTAssertEqual(docsAPI.requests.map(\.target), ["/docs/a"])
        XCTAssertEqual(api.requests.map(\.target), ["/hrx"], "no match: the top-level upstream")
        XCTAssertNil(docsAPI.requests.first?.header("authorization"), "the docs route's token goes in its own header")
        let metrics = String(decoding: try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").body, as: UTF8.self)
        let requestLines = metrics.split(separator: "\n").filter { $0.hasPrefix("tokenrelay_requests_total{") }
        XCTAssertEqual(Set(requestLines.map { line in line.contains(#"route="hr""#) ? "hr" : line.contains(#"route="docs""#) ? "docs"
                                                : line.contains(#"route="default""#) ? "default" : String(line) }),
                       ["hr", "docs", "default"], "request metrics by route: \(requestLines)")
        XCTAssertTrue(requestLines.contains { $0.contains(#"route="hr""#) && $0.hasSuffix(" 2") }, "\(requestLines)")
    }

    /// An absolute-form target is judged by its authority whatever route its path picks: a strip_prefix route
    /// (whose target is cut to origin-form before it goes up) must refuse another host, another scheme and
    /// userinfo as the others do, not send the request to its upstream with a token under another name.
    func testAbsoluteFormOnAStrippingRouteIsRefusedUnlessItNamesTheRelay() throws {
        let relay = try startRelay(["routes": routes])
        let port = relay.proxyPort
        for target in ["http://evil.example/hr/x", "https://127.0.0.1:\(port)/hr/x", "http://user@127.0.0.1:\(port)/hr/x",
                       "http://127.0.0.1:1/hr/x"] {
            let raw = try HTTPTestClient.sendRaw(port: port, bytes: Data("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8), timeout: 5)
            XCTAssertTrue(String(decoding: raw, as: UTF8.self).hasPrefix("HTTP/1.1 400"), "\(target): \(String(decoding: raw.prefix(60), as: UTF8.self))")
        }
        XCTAssertEqual(hrAPI.requests.count, 0, "nothing reached the route's upstream")
        let raw = try HTTPTestClient.sendRaw(port: port, bytes: Data("GET http://127.0.0.1:\(port)/hr/ok HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8), timeout: 5)
        XCTAssertTrue(String(decoding: raw, as: UTF8.self).hasPrefix("HTTP/1.1 200"), String(decoding: raw.prefix(60), as: UTF8.self))
        XCTAssertEqual(hrAPI.requests.map(\.target), ["/ok"], "the relay's own address: stripped, as origin-form")
    }

    /// Over HTTP/2 (h2c, prior knowledge) the route is chosen by `:authority` as it is by Host over HTTP/1.1:
    /// the same path goes to the docs route under its host and to the top-level upstream under another.
    func testHostRoutingOverHTTP2FollowsTheAuthority() throws {
        guard toolExists("curl") else { throw XCTSkip("curl is not installed") }
        let relay = try startRelay(["routes": routes])
        let port = relay.proxyPort
        func h2(_ host: String, _ path: String) throws -> String {
            try runTool("curl", ["-sS", "-i", "--http2-prior-knowledge", "--max-time", "20", "--resolve", "\(host):\(port):127.0.0.1",
                                 "http://\(host):\(port)\(path)"], timeout: 30).stdout
        }
        XCTAssertTrue(try h2("docs.test", "/docs/h2").hasPrefix("HTTP/2 200"))
        XCTAssertTrue(try h2("localhost", "/docs/h2-elsewhere").hasPrefix("HTTP/2 200"))
        XCTAssertTrue(try h2("localhost", "/hr/h2").hasPrefix("HTTP/2 200"))
        XCTAssertEqual(docsAPI.requests.map(\.target), ["/docs/h2"], "the :authority docs.test chose the docs route")
        XCTAssertNil(docsAPI.requests.first?.header("authorization"))
        XCTAssertNotNil(docsAPI.requests.first?.header("x-docs-token"), "the route's own header carries the token")
        XCTAssertEqual(api.requests.map(\.target), ["/docs/h2-elsewhere"], "another authority: the top-level upstream")
        XCTAssertEqual(hrAPI.requests.map(\.target), ["/h2"], "no host route for it: the prefix route, stripped")
    }

    func testBurstOnAllRoutesAfterTheTokenDiedRefreshesOnce() throws {
        let relay = try startRelay(["routes": routes])
        XCTAssertEqual(try fetchVia(relay, "/warm").status, 200)
        tokenServer.expireAccessTokens()
        let port = relay.proxyPort
        let results = HTTPTestClient.concurrently(30) { index in
            switch index % 3 {
            case 0: try HTTPTestClient.send(port: port, method: "GET", path: "/hr/item/\(index)")
            case 1: try HTTPTestClient.send(port: port, method: "GET", path: "/d/\(index)", headers: [("Host", "docs.test")])
            default: try HTTPTestClient.send(port: port, method: "GET", path: "/plain/\(index)")
            }
        }
        XCTAssertEqual(results.map { (try? $0.get().status) ?? -1 }, Array(repeating: 200, count: 30))
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "one identity, one refresh")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(hrAPI.requests.filter { $0.target.hasPrefix("/item/") }.map(\.target).count >= 10, true)
    }

    func testReloadAddingARouteUnderLoadLosesNoRequest() throws {
        let relay = try startRelay()
        let port = relay.proxyPort
        // Each client keeps sending until the reload is done and then a little more (bounded either way).
        let reloaded = Locked(false)
        let load = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(6) { index -> [Int] in
                var statuses: [Int] = [], afterReload = 0
                for step in 0..<2000 where afterReload < 20 {
                    statuses.append(try HTTPTestClient.send(port: port, method: "GET", path: "/hr/load/\(index)/\(step)").status)
                    if reloaded.withLock({ $0 }) { afterReload += 1 }
                }
                return statuses
            }
        }
        // The reload lands while the load runs: some requests have gone to the top-level upstream first.
        XCTAssertTrue(waitUntil(timeout: 10) { self.api.requestCount > 0 })
        try reload(relay, ["routes": routes])
        reloaded.withLock { $0 = true }
        let results = try load.wait(timeout: 120)
        let statuses = results.flatMap { (try? $0.get()) ?? [-1] }
        XCTAssertEqual(Set(statuses), [200], "every request answered 200 across the reload")
        XCTAssertGreaterThan(hrAPI.requests.count, 0, "requests after the reload went to the added route")
        XCTAssertGreaterThan(api.requests.count, 0, "requests before it went to the top-level upstream")
        XCTAssertEqual(try fetchVia(relay, "/hr/after").status, 200)
        XCTAssertEqual(hrAPI.requests.last?.target, "/after", "the added route serves after the reload")
        XCTAssertTrue(relay.stderrText.contains("config reloaded"))
    }
}
