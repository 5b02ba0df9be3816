import Foundation
import XCTest

/// Routes served beyond the main listener's prefix and host matching: a route's own `listen` (a second
/// listener whose requests are all that route's), a route's own `inject` format, the 404 of a config
/// without a top-level `upstream`, and each route's `max_held_requests`.
final class RouteListenersTests: ReloadTestCase {
    /// The port a route's own listener was bound to, from its `route listening` line.
    private func routePort(_ relay: TokenRelayProcess, _ name: String) throws -> Int {
        var port: Int?
        _ = waitUntil(timeout: 10) {
            for line in relay.stderrText.split(separator: "\n") where line.contains("route listening") && line.contains("route=\(name)") {
                guard let range = line.range(of: "proxy=127.0.0.1:") else { continue }
                port = Int(String(line[range.upperBound...].prefix { $0.isNumber }))
            }
            return port != nil
        }
        return try XCTUnwrap(port, "no 'route listening' line for \(name): \(relay.stderrText)")
    }

    private func tokenAPI(header: String, scheme: String) throws -> FakeAPIServer {
        let tokens = tokenServer!
        return stoppedInTearDown(try FakeAPIServer(validateToken: { value in
            value.hasPrefix(scheme) && tokens.isAccessTokenValid(String(value.dropFirst(scheme.count)))
        }, tokenHeader: header))
    }

    func testARouteWithItsOwnListenerTakesEverythingArrivingThereWithItsOwnTokenFormat() throws {
        let payAPI = try tokenAPI(header: "X-Api-Token", scheme: "Token ")
        let hrAPI = try secondAPI()
        let routes: [[String: Any]] = [
            ["name": "hr", "match": ["path_prefix": "/hr/", "strip_prefix": true], "upstream": ["url": hrAPI.baseURL]],
            ["name": "pay", "listen": "127.0.0.1:0", "upstream": ["url": payAPI.baseURL],
             "inject": ["header": "X-Api-Token", "format": "Token {token}"]],
        ]
        let relay = try startRelay(["routes": routes])
        let payPort = try routePort(relay, "pay")
        XCTAssertNotEqual(payPort, relay.proxyPort)
        XCTAssertEqual(try HTTPTestClient.send(port: payPort, method: "GET", path: "/hr/x?q=1").status, 200)
        XCTAssertEqual(payAPI.requests.map(\.target), ["/hr/x?q=1"], "everything on the route's listener is the route's: no prefix match there")
        XCTAssertNil(payAPI.requests.first?.header("authorization"))
        XCTAssertEqual(try get(relay, "/hr/y").status, 200)
        XCTAssertEqual(hrAPI.requests.map(\.target), ["/y"], "the main listener still matches by prefix")
        XCTAssertEqual(try get(relay, "/plain").status, 200)
        XCTAssertEqual(api.requests.map(\.target), ["/plain"])

        // After a refresh, the route's own format carries the new token.
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try HTTPTestClient.send(port: payPort, method: "GET", path: "/after").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(payAPI.requests.last?.header("x-api-token"), "Token \(tokenServer.currentAccessToken ?? "?")")

        // A reload changes the listener's route live (same address); adding a listener waits for a restart.
        let payAPI2 = try tokenAPI(header: "X-Api-Token", scheme: "Token ")
        var moved = routes
        moved[1]["upstream"] = ["url": payAPI2.baseURL]
        moved.append(["name": "extra", "listen": "127.0.0.1:1", "upstream": ["url": api.baseURL]])
        try reload(relay, ["routes": moved])
        XCTAssertTrue(relay.stderrText.contains("routes[].listen: changing it needs a restart"), relay.stderrText)
        XCTAssertEqual(try HTTPTestClient.send(port: payPort, method: "GET", path: "/moved").status, 200)
        XCTAssertEqual(payAPI2.requests.map(\.target), ["/moved"], "the listener serves its route's reloaded upstream")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// A client that uses a route's listener as its HTTP proxy names that listener in an absolute-form target:
    /// it is the relay itself there (as the main listener's address is on the main listener); another
    /// host is still refused.
    func testAbsoluteFormNamingARouteListenerIsServedThere() throws {
        let payAPI = try tokenAPI(header: "X-Api-Token", scheme: "Token ")
        let relay = try startRelay(["routes": [["name": "pay", "listen": "127.0.0.1:0", "upstream": ["url": payAPI.baseURL],
                                                "inject": ["header": "X-Api-Token", "format": "Token {token}"]]]])
        let payPort = try routePort(relay, "pay")
        func send(_ target: String) throws -> String {
            let raw = try HTTPTestClient.sendRaw(port: payPort, bytes: Data("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1:\(payPort)\r\nConnection: close\r\n\r\n".utf8))
            return String(decoding: raw.prefix(12), as: UTF8.self)
        }
        XCTAssertEqual(try send("http://127.0.0.1:\(payPort)/abs?q=1"), "HTTP/1.1 200")
        XCTAssertEqual(payAPI.requests.map(\.target), ["/abs?q=1"])
        XCTAssertEqual(try send("http://evil.example/x"), "HTTP/1.1 400")
        XCTAssertEqual(payAPI.requests.count, 1)
    }

    func testWithoutATopLevelUpstreamARequestMatchingNoRouteGets404() throws {
        let hrAPI = try secondAPI()
        let relay = try startRelay(["upstream": NSNull(),
                                    "routes": [["name": "hr", "match": ["path_prefix": "/hr"], "upstream": ["url": hrAPI.baseURL]]]])
        let missing = try get(relay, "/other/thing?secret=abc")
        XCTAssertEqual(missing.status, 404)
        XCTAssertTrue(missing.bodyText.contains("\"no_route\""), missing.bodyText)
        XCTAssertEqual(try get(relay, "/hr/x").status, 200, "the connection's next requests and the route still serve")
        XCTAssertEqual(hrAPI.requests.map(\.target), ["/hr/x"])
        XCTAssertEqual(api.requestCount, 0, "no upstream contact for the unmatched request")
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("request answered 404: no route matches") })
        let lines = relay.stderrText.split(separator: "\n").filter { $0.contains("no route matches") }
        XCTAssertEqual(lines.count, 1, "one line: \(lines)")
        XCTAssertTrue(lines[0].contains("path=/other/thing") && !lines[0].contains("secret=abc"), "\(lines[0])")
    }

    func testOneRoutesFloodOfHeldRequestsLeavesAnotherRoutesHeldSlots() throws {
        let routes: [[String: Any]] = [
            ["name": "a", "match": ["path_prefix": "/a"], "upstream": ["url": api.baseURL], "max_held_requests": 2],
            ["name": "b", "match": ["path_prefix": "/b"], "upstream": ["url": api.baseURL], "max_held_requests": 2],
        ]
        let relay = try startRelay(["routes": routes, "limits": ["max_held_requests": 4]])
        XCTAssertEqual(try get(relay, "/a/warm").status, 200)
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let port = relay.proxyPort
        // Route a floods: two are held for the (gated) refresh, the next three are refused at once.
        let flood = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(2) { index in try HTTPTestClient.send(port: port, method: "GET", path: "/a/\(index)").status }
        }
        XCTAssertTrue(waitUntil(timeout: 10) { self.heldRequests(relay) == 2 })
        let refused = try (0..<3).map { try get(relay, "/a/more/\($0)").status }
        XCTAssertEqual(refused, [503, 503, 503], "a is at its own max_held_requests")
        // Route b still has its own slots.
        let others = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(2) { index in try HTTPTestClient.send(port: port, method: "GET", path: "/b/\(index)").status }
        }
        XCTAssertTrue(waitUntil(timeout: 10) { self.heldRequests(relay) == 4 }, "b's requests are held beside a's")
        tokenServer.openGate()
        let floodStatuses = try flood.wait(timeout: 30).map { (try? $0.get()) ?? -1 }
        let otherStatuses = try others.wait(timeout: 30).map { (try? $0.get()) ?? -1 }
        XCTAssertEqual(floodStatuses, [200, 200], "a: two held and replayed")
        XCTAssertEqual(otherStatuses, [200, 200], "b: held and replayed, none refused")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// h2c (prior knowledge) takes the same routes: a route listener's streams are its route's, and a stream
    /// matching no route gets the 404 (a gRPC call its gRPC form, UNIMPLEMENTED).
    func testHTTP2StreamsTakeTheListenersRouteAndTheNoRoute404() throws {
        guard toolExists("curl") else { throw XCTSkip("curl is not installed") }
        let payAPI = try tokenAPI(header: "X-Api-Token", scheme: "Token ")
        let relay = try startRelay(["upstream": NSNull(),
                                    "routes": [["name": "pay", "listen": "127.0.0.1:0", "upstream": ["url": payAPI.baseURL],
                                                "inject": ["header": "X-Api-Token", "format": "Token {token}"]],
                                               ["name": "hr", "match": ["path_prefix": "/hr"], "upstream": ["url": api.baseURL]]]])
        let payPort = try routePort(relay, "pay")
        func curl(_ port: Int, _ path: String, _ extra: [String] = []) throws -> ToolResult {
            try runTool("curl", ["-sS", "-i", "--http2-prior-knowledge", "--max-time", "20"] + extra + ["http://127.0.0.1:\(port)\(path)"], timeout: 30)
        }
        XCTAssertTrue(try curl(payPort, "/any/path").stdout.hasPrefix("HTTP/2 200"))
        XCTAssertEqual(payAPI.requests.map(\.target), ["/any/path"])
        XCTAssertTrue(try curl(relay.proxyPort, "/hr/x").stdout.hasPrefix("HTTP/2 200"))
        XCTAssertTrue(try curl(relay.proxyPort, "/nowhere").stdout.hasPrefix("HTTP/2 404"))
        let grpc = try curl(relay.proxyPort, "/pkg.Service/Call", ["-H", "content-type: application/grpc", "-H", "te: trailers", "--data-binary", "x"])
        // tokenrelay's 404 to a gRPC call is a gRPC status (GRPCLocalAnswer): UNIMPLEMENTED, with its message.
        XCTAssertTrue(grpc.stdout.hasPrefix("HTTP/2 200"), grpc.stdout)
        XCTAssertTrue(grpc.stdout.lowercased().contains("grpc-status: 12"), grpc.stdout)
        XCTAssertEqual(api.requests.map(\.target), ["/hr/x"])
    }

    private func heldRequests(_ relay: TokenRelayProcess) -> Int {
        guard let body = try? admin(relay, "/status").body,
              let object = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else { return -1 }
        return (object["held_requests"] as? Int) ?? -1
    }
}
