import XCTest
@testable import TokenRelay

/// The route lookup on the main listener, in-process: host and prefix rules, strip_prefix, the default.
final class RouteTableTests: XCTestCase {
    private func route(_ name: String, host: String? = nil, prefix: String? = nil, strip: Bool = false, listen: Bool = false) -> Config.Route {
        Config.Route(name: name, listen: listen ? ListenAddress(host: "127.0.0.1", port: 9999) : nil,
                     match: listen ? nil : Config.RouteMatch(host: host, pathPrefix: prefix, stripPrefix: strip),
                     upstream: Config.Upstream(url: try! HTTPEndpoint.parse("http://u", field: "u")), identity: nil, inject: nil)
    }

    private func resolve(_ table: RouteTable, _ target: String, host: String? = "relay.local") -> RouteTable.Resolution {
        let targetBytes = Array(target.utf8)
        let hostBytes = host.map { Array($0.utf8) }
        return targetBytes.withUnsafeBufferPointer { targetBuffer in
            guard let hostBytes else { return table.resolve(host: nil, target: targetBuffer) }
            return hostBytes.withUnsafeBufferPointer { table.resolve(host: $0, target: targetBuffer) }
        }
    }

    private func stripped(_ target: String, _ strip: Int) -> String {
        var buffer: [UInt8] = []
        RouteTable.appendStripped(Array(target.utf8)[...], strip: strip, to: &buffer)
        return String(decoding: buffer, as: UTF8.self)
    }

    func testNoRoutesIsAlwaysTheDefault() {
        let table = RouteTable(routes: [], hasDefaultRoute: true)
        XCTAssertTrue(table.isEmpty)
        XCTAssertEqual(resolve(table, "/anything"), .defaultRoute)
        XCTAssertEqual(resolve(RouteTable(routes: [], hasDefaultRoute: false), "/x"), .none)
    }

    func testLongestPrefixWinsOnSegmentBoundaries() {
        let table = RouteTable(routes: [route("api", prefix: "/api"), route("v2", prefix: "/api/v2/"), route("hr", prefix: "/hr/")], hasDefaultRoute: true)
        XCTAssertEqual(resolve(table, "/api"), .route(index: 0, strip: 0))
        XCTAssertEqual(resolve(table, "/api?x=1"), .route(index: 0, strip: 0))
        XCTAssertEqual(resolve(table, "/api/v1/users"), .route(index: 0, strip: 0))
        XCTAssertEqual(resolve(table, "/api/v2/users"), .route(index: 1, strip: 0))
        XCTAssertEqual(resolve(table, "/api/v2"), .route(index: 0, strip: 0), "/api/v2/ needs its slash")
        XCTAssertEqual(resolve(table, "/apix"), .defaultRoute, "not on a segment boundary")
        XCTAssertEqual(resolve(table, "/hr/people"), .route(index: 2, strip: 0))
        XCTAssertEqual(resolve(table, "/HR/people"), .defaultRoute, "paths compare exactly")
        XCTAssertEqual(resolve(RouteTable(routes: [route("hr", prefix: "/hr/")], hasDefaultRoute: false), "/payroll"), .none)
    }

    func testStripPrefixKeepsALeadingSlash() {
        let table = RouteTable(routes: [route("hr", prefix: "/hr/", strip: true), route("pay", prefix: "/pay", strip: true)], hasDefaultRoute: false)
        XCTAssertEqual(resolve(table, "/hr/people?x"), .route(index: 0, strip: 3))
        XCTAssertEqual(stripped("/hr/people?x", 3), "/people?x")
        XCTAssertEqual(resolve(table, "/pay"), .route(index: 1, strip: 4))
        XCTAssertEqual(stripped("/pay", 4), "/")
        XCTAssertEqual(stripped("/pay?a=b", 4), "/?a=b")
        XCTAssertEqual(stripped("/pay/x", 4), "/x")
    }

    func testHostRoutesComeFirstAndIgnorePortAndCase() {
        let table = RouteTable(routes: [route("any-hr", prefix: "/hr/"), route("docs", host: "docs.internal"),
                                        route("docs-hr", host: "docs.internal", prefix: "/hr/"), route("ported", host: "api.local:8443")],
                               hasDefaultRoute: true)
        XCTAssertEqual(resolve(table, "/hr/x", host: "DOCS.internal:8080"), .route(index: 2, strip: 0))
        XCTAssertEqual(resolve(table, "/other", host: "docs.internal"), .route(index: 1, strip: 0))
        XCTAssertEqual(resolve(table, "/other", host: "docs.internal."), .route(index: 1, strip: 0))
        XCTAssertEqual(resolve(table, "/hr/x", host: "relay.local"), .route(index: 0, strip: 0))
        XCTAssertEqual(resolve(table, "/x", host: "docs.internal.evil"), .defaultRoute)
        XCTAssertEqual(resolve(table, "/x", host: nil), .defaultRoute)
        XCTAssertEqual(resolve(table, "/x", host: "api.local:8443"), .route(index: 3, strip: 0))
        XCTAssertEqual(resolve(table, "/x", host: "api.local"), .defaultRoute, "a pattern with a port needs that port")
        let v6 = RouteTable(routes: [route("v6", host: "[::1]")], hasDefaultRoute: false)
        XCTAssertEqual(resolve(v6, "/", host: "[::1]:8080"), .route(index: 0, strip: 0))
    }

    func testAbsoluteFormUsesItsAuthorityAndPath() {
        let table = RouteTable(routes: [route("docs", host: "docs.internal", prefix: "/d/", strip: true), route("root", prefix: "/")], hasDefaultRoute: false)
        XCTAssertEqual(resolve(table, "http://docs.internal:80/d/x", host: "other"), .route(index: 0, strip: 25))
        XCTAssertEqual(stripped("http://docs.internal:80/d/x", 25), "/x")
        XCTAssertEqual(resolve(table, "http://elsewhere"), .route(index: 1, strip: 0), "no path asks for /")
    }

    func testOwnListenerRoutesAreNotOnTheMainListener() {
        let table = RouteTable(routes: [route("own", listen: true)], hasDefaultRoute: true)
        XCTAssertTrue(table.isEmpty)
        XCTAssertEqual(resolve(table, "/"), .defaultRoute)
    }
}
