import Foundation
import XCTest

/// `limits.max_upstream_connections` bounds the whole process, every route's pool together: the upstreams
/// never see more connections in all, every request is answered, a route waiting only for that limit is
/// served as soon as another route frees a connection, idle connections of one route make room for
/// another, and a reload moves the limit without cutting connections in use.
final class SharedUpstreamLimitTests: ReloadTestCase {
    /// The most connections the upstreams had open at once, counted at each accept across all of them.
    private final class Census: @unchecked Sendable {
        private let peak = Locked(0)
        private let servers: [FakeAPIServer]

        init(_ servers: [FakeAPIServer]) {
            self.servers = servers
            for server in servers { server.onAccepted = { [unowned self] in self.count() } }
        }

        private func count() {
            let live = servers.reduce(0) { $0 + $1.liveConnections }
            peak.withLock { $0 = max($0, live) }
        }

        var highest: Int { peak.withLock { $0 } }
        func reset() { peak.withLock { $0 = 0 } }
        func stop() { for server in servers { server.onAccepted = nil } }
    }

    private func twoRoutes(_ apiA: FakeAPIServer, _ apiB: FakeAPIServer) -> [[String: Any]] {
        [["name": "a", "match": ["path_prefix": "/a/"], "upstream": ["url": apiA.baseURL]],
         ["name": "b", "match": ["path_prefix": "/b/"], "upstream": ["url": apiB.baseURL]]]
    }

    private func send(_ relay: TokenRelayProcess, _ path: String) -> AsyncCall<Int> {
        let port = relay.proxyPort
        return AsyncCall { try HTTPTestClient.send(port: port, method: "GET", path: path, timeout: 30).status }
    }

    /// Slow requests on both routes at once: never more than 2 upstream connections in all (each route
    /// alone could open 2 before), and every request gets 200.
    func testConcurrentSlowRequestsOnTwoRoutesStayWithinTheProcessLimit() throws {
        let apiA = try secondAPI(), apiB = try secondAPI()
        apiA.responseDelay = 0.2
        apiB.responseDelay = 0.2
        let census = Census([api, apiA, apiB])
        defer { census.stop() }
        let relay = try startRelay(["routes": twoRoutes(apiA, apiB),
                                    "limits": ["max_upstream_connections": 2], "timeouts": ["pool_wait_seconds": 20]])
        let calls = (0..<8).flatMap { i in [send(relay, "/a/\(i)"), send(relay, "/b/\(i)")] }
        let statuses = try calls.map { try $0.wait(timeout: 40) }
        XCTAssertEqual(statuses, Array(repeating: 200, count: 16), "every request answered")
        XCTAssertEqual(apiA.requestCount, 8)
        XCTAssertEqual(apiB.requestCount, 8)
        XCTAssertGreaterThan(census.highest, 0)
        XCTAssertLessThanOrEqual(census.highest, 2, "upstream connections open at once, all routes together")
    }

    /// Both connections are busy on route a; a request on route b waits for the limit alone and is served
    /// when the first of a's connections comes back (about 1 s), long before its pool wait (5 s) would
    /// answer 503.
    func testAWaiterOnOneRouteIsServedWhenAnotherRouteFreesAConnection() throws {
        let apiA = try secondAPI(), apiB = try secondAPI()
        apiA.responseDelay = 1
        let census = Census([api, apiA, apiB])
        defer { census.stop() }
        let relay = try startRelay(["routes": twoRoutes(apiA, apiB),
                                    "limits": ["max_upstream_connections": 2], "timeouts": ["pool_wait_seconds": 5]])
        let slow = [send(relay, "/a/1"), send(relay, "/a/2")]
        XCTAssertTrue(waitUntil(timeout: 10) { apiA.requestCount == 2 }, "both of a's requests reached its upstream")
        let started = Date()
        XCTAssertEqual(try send(relay, "/b/waits").wait(timeout: 20), 200)
        XCTAssertLessThan(Date().timeIntervalSince(started), 4, "served when a's connection came back, not at the pool wait")
        XCTAssertEqual(apiB.requestCount, 1)
        XCTAssertEqual(try slow.map { try $0.wait(timeout: 20) }, [200, 200])
        XCTAssertLessThanOrEqual(census.highest, 2)
    }

    /// Route a's two connections stay idle (pool_idle_seconds 60) after its burst: a request on route b
    /// has the older closed for it and is served at once, instead of waiting its pool wait for nothing.
    func testIdleConnectionsOfOneRouteMakeRoomForAnother() throws {
        let apiA = try secondAPI(), apiB = try secondAPI()
        apiA.responseDelay = 0.3
        let census = Census([api, apiA, apiB])
        defer { census.stop() }
        let relay = try startRelay(["routes": twoRoutes(apiA, apiB), "limits": ["max_upstream_connections": 2],
                                    "timeouts": ["pool_wait_seconds": 5, "pool_idle_seconds": 60]])
        XCTAssertEqual(try [send(relay, "/a/1"), send(relay, "/a/2")].map { try $0.wait(timeout: 20) }, [200, 200])
        XCTAssertEqual(apiA.acceptedConnections, 2)
        let started = Date()
        XCTAssertEqual(try send(relay, "/b/1").wait(timeout: 20), 200)
        XCTAssertLessThan(Date().timeIntervalSince(started), 3, "an idle connection of a made room at once")
        XCTAssertTrue(waitUntil(timeout: 5) { apiA.openConnections == 1 }, "one of a's idle connections was closed")
        XCTAssertLessThanOrEqual(census.highest, 2)
        // a keeps its other connection: its next request reuses it.
        XCTAssertEqual(try send(relay, "/a/3").wait(timeout: 20), 200)
        XCTAssertEqual(apiA.acceptedConnections, 2)
    }

    /// Route isolation (limit 8): route a's upstream is slow and 10 of its requests arrive at once. a
    /// takes all but the others' reserves (6 connections) and its other requests wait for those; a request
    /// on route b then finds its reserve free and is served at once, not when a's first response ends
    /// (2.5 s) or at its pool wait (4 s). Without the reserves a took all 8 and b waited behind it.
    func testASlowRouteLeavesAnotherRouteItsReserve() throws {
        let apiA = try secondAPI(), apiB = try secondAPI()
        apiA.responseDelay = 2.5
        let census = Census([api, apiA, apiB])
        defer { census.stop() }
        let relay = try startRelay(["routes": twoRoutes(apiA, apiB),
                                    "limits": ["max_upstream_connections": 8], "timeouts": ["pool_wait_seconds": 4]])
        let slow = (0..<10).map { send(relay, "/a/\($0)") }
        XCTAssertTrue(waitUntil(timeout: 10) { apiA.requestCount == 6 }, "a's first six requests reached its upstream")
        XCTAssertEqual(apiA.liveConnections, 6, "a holds all but the other routes' reserves (2 of 8)")
        let started = Date()
        XCTAssertEqual(try send(relay, "/b/1").wait(timeout: 20), 200)
        XCTAssertLessThan(Date().timeIntervalSince(started), 1.5, "b was served from its reserve at once")
        XCTAssertEqual(apiB.requestCount, 1)
        XCTAssertLessThanOrEqual(apiA.liveConnections, 7, "a never above the limit minus b's reserve while b waited")
        XCTAssertEqual(try slow.map { try $0.wait(timeout: 30) }, Array(repeating: 200, count: 10), "a's waiters were served as its connections came back")
        XCTAssertLessThanOrEqual(census.highest, 8)
    }

    /// A reload lowering the limit and adding a route: requests in flight finish on their connections
    /// (none is cut), and from then on the lower limit bounds all routes, the new one included.
    func testAReloadMovesTheLimitWithoutCuttingConnectionsInUse() throws {
        let apiA = try secondAPI(), apiB = try secondAPI(), apiC = try secondAPI()
        apiA.responseDelay = 1
        let census = Census([api, apiA, apiB, apiC])
        defer { census.stop() }
        var routes = twoRoutes(apiA, apiB)
        let relay = try startRelay(["routes": routes, "limits": ["max_upstream_connections": 2], "timeouts": ["pool_wait_seconds": 20]])
        let inFlight = [send(relay, "/a/1"), send(relay, "/a/2")]
        XCTAssertTrue(waitUntil(timeout: 10) { apiA.requestCount == 2 })
        routes.append(["name": "c", "match": ["path_prefix": "/c/"], "upstream": ["url": apiC.baseURL]])
        try reload(relay, ["routes": routes, "limits": ["max_upstream_connections": 1], "timeouts": ["pool_wait_seconds": 20]])
        XCTAssertTrue(relay.stderrText.contains("config reloaded"), relay.stderrText)
        XCTAssertEqual(try inFlight.map { try $0.wait(timeout: 20) }, [200, 200], "connections in use are not cut by a lower limit")
        apiA.responseDelay = 0.1
        XCTAssertTrue(waitUntil(timeout: 5) { apiA.liveConnections <= 1 }, "the old pool's connections were let go")
        census.reset()
        let burst = (0..<3).flatMap { i in [send(relay, "/a/\(i)"), send(relay, "/b/\(i)"), send(relay, "/c/\(i)")] }
        XCTAssertEqual(try burst.map { try $0.wait(timeout: 40) }, Array(repeating: 200, count: 9))
        XCTAssertEqual(apiC.requestCount, 3)
        XCTAssertLessThanOrEqual(census.highest, 1, "the reloaded limit bounds every route, the added one too")
    }

    /// An HTTP/2 route and an HTTP/1.1 route under a limit of 1: each route's idle connection is closed
    /// for the other's request (the HTTP/2 pool draws from the same budget), and every request gets 200.
    func testAnHTTP2RouteAndAnHTTP1RouteShareTheLimit() throws {
        try requireH2Fixture()
        let h2 = try H2Upstream(workDir: workDir)
        defer { h2.stop() }
        let apiB = try secondAPI()
        let census = Census([api, apiB])
        defer { census.stop() }
        let routes: [[String: Any]] = [
            ["name": "a", "match": ["path_prefix": "/a/"], "upstream": ["url": h2.url, "http2": "prior_knowledge"]],
            ["name": "b", "match": ["path_prefix": "/b/"], "upstream": ["url": apiB.baseURL]],
        ]
        let relay = try startRelay(["data_plane": "transport", "routes": routes, "limits": ["max_upstream_connections": 1],
                                    "timeouts": ["pool_wait_seconds": 5, "pool_idle_seconds": 60]])
        XCTAssertEqual(try send(relay, "/a/1").wait(timeout: 20), 200)
        XCTAssertEqual(h2.connectionCount, 1)
        let started = Date()
        XCTAssertEqual(try send(relay, "/b/1").wait(timeout: 20), 200, "the idle HTTP/2 connection made room")
        XCTAssertEqual(try send(relay, "/a/2").wait(timeout: 20), 200, "b's idle connection made room in turn")
        XCTAssertLessThan(Date().timeIntervalSince(started), 4, "neither waited for its pool wait")
        XCTAssertEqual(h2.connectionCount, 2, "a's first connection was closed for b, so a opened another")
        XCTAssertTrue(waitUntil(timeout: 5) { apiB.openConnections == 0 }, "b's idle connection was closed for a")
        XCTAssertLessThanOrEqual(census.highest, 1)
    }

    /// An HTTP/2 route whose streams overlap without pause (each answered after 0.6 s, a new one every
    /// 0.15 s for 4 s) and an HTTP/1.1 route, under a limit of 1: the HTTP/1.1 request is served while the
    /// HTTP/2 traffic still runs (the HTTP/2 connection yields its slot after its streams in flight), not
    /// only once that traffic stops; every request gets 200.
    func testAnHTTP2RouteWithOverlappingStreamsYieldsItsConnection() throws {
        try requireH2Fixture()
        let h2 = try H2Upstream(workDir: workDir, settings: ["delay_ms": 600])
        defer { h2.stop() }
        let apiB = try secondAPI()
        let routes: [[String: Any]] = [
            ["name": "a", "match": ["path_prefix": "/a/"], "upstream": ["url": h2.url, "http2": "prior_knowledge"]],
            ["name": "b", "match": ["path_prefix": "/b/"], "upstream": ["url": apiB.baseURL]],
        ]
        let relay = try startRelay(["data_plane": "transport", "routes": routes, "limits": ["max_upstream_connections": 1],
                                    "timeouts": ["pool_wait_seconds": 20]])
        let port = relay.proxyPort
        var traffic: [AsyncCall<Int>] = []
        var other: AsyncCall<Date>?
        let start = Date()
        while Date().timeIntervalSince(start) < 4 {
            traffic.append(send(relay, "/a/\(traffic.count)"))
            if other == nil && Date().timeIntervalSince(start) > 1 {
                other = AsyncCall {
                    let status = try HTTPTestClient.send(port: port, method: "GET", path: "/b/1", timeout: 30).status
                    guard status == 200 else { throw TestSupportError("route b got \(status)") }
                    return Date()
                }
            }
            usleep(150_000)   // the pace of the HTTP/2 traffic, not a wait for anything
        }
        let trafficEnd = Date()
        let served = try XCTUnwrap(other).wait(timeout: 30)
        XCTAssertLessThan(served, trafficEnd, "route b was served while route a's streams kept overlapping")
        XCTAssertEqual(try traffic.map { try $0.wait(timeout: 30) }, Array(repeating: 200, count: traffic.count))
        XCTAssertGreaterThanOrEqual(h2.connectionCount, 2, "a's connection yielded and a opened another afterwards")
    }

    private func requireH2Fixture() throws {
        guard ["/usr/bin/python3", "python3"].contains(where: { (try? runTool($0, ["-c", "import h2"], timeout: 30))?.exitCode == 0 }) else {
            throw XCTSkip("python3 h2 is not installed (scripts/ensure-deps --test installs python3-h2)")
        }
    }
}
