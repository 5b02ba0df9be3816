import Foundation
import XCTest
@testable import TokenRelay

/// `Config.heldRequestShare`: a route without its own `max_held_requests` gets an equal part of what the
/// explicit ones leave of `limits.max_held_requests` (at least 1); a single route keeps the whole limit.
final class HeldRequestShareTests: XCTestCase {
    private func config(upstream: Bool = true, global: Int? = 1024, routes: [Int?]) throws -> Config {
        var object: [String: Any] = [
            "listen": "127.0.0.1:8080",
            "tokens": ["file": "/var/lib/tokenrelay/tokens.json"],
            "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
        ]
        if upstream { object["upstream"] = ["url": "http://127.0.0.1:9000"] }
        if let global { object["limits"] = ["max_held_requests": global] }
        if !routes.isEmpty {
            object["routes"] = routes.enumerated().map { index, limit -> [String: Any] in
                var route: [String: Any] = ["name": "r\(index)", "match": ["path_prefix": "/r\(index)/"], "upstream": ["url": "http://127.0.0.1:900\(index)"]]
                if let limit { route["max_held_requests"] = limit }
                return route
            }
        }
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    private func shares(_ config: Config) -> [Int] {
        [config.heldRequestShare(route: nil)] + config.routes.indices.map { config.heldRequestShare(route: $0) }
    }

    func testASingleRouteKeepsTheWholeGlobalLimit() throws {
        XCTAssertEqual(shares(try config(routes: [])), [1024], "no routes: the top-level route has it all, as before")
        XCTAssertEqual(shares(try config(global: nil, routes: [])), [1024], "the default global limit")
        let routesOnly = try config(upstream: false, global: 100, routes: [nil])
        XCTAssertEqual(routesOnly.heldRequestShare(route: 0), 100, "one route and no top-level upstream: the whole limit")
        XCTAssertNil(routesOnly.heldRequestShareWarning)
    }

    func testRoutesWithoutTheirOwnLimitShareWhatTheExplicitOnesLeave() throws {
        XCTAssertEqual(shares(try config(global: 4, routes: [nil])), [2, 2], "the top-level route and one route")
        XCTAssertEqual(shares(try config(global: 100, routes: [nil, nil])), [33, 33, 33], "rounded down: the global limit still bounds")
        XCTAssertEqual(shares(try config(global: 100, routes: [40, nil, 10])), [25, 40, 25, 10])
        XCTAssertEqual(Array(shares(try config(upstream: false, global: 100, routes: [40, nil, nil])).dropFirst()), [40, 30, 30],
                       "without a top-level upstream the default route answers 404 and takes no share")
        XCTAssertEqual(shares(try config(global: 100, routes: [60, 40])), [1, 60, 40], "nothing left: at least 1")
        XCTAssertNil(try config(global: 100, routes: [40, nil, 10]).heldRequestShareWarning)
    }

    func testExplicitLimitsBeyondTheGlobalOneAreKeptAndWarnedAbout() throws {
        // A config that ran before still runs: the global limit bounds the process whatever the routes say.
        let over = try config(upstream: false, global: 10, routes: [8, 8])
        XCTAssertEqual(shares(over).dropFirst(), [8, 8])
        let warning = try XCTUnwrap(over.heldRequestShareWarning)
        XCTAssertTrue(warning.contains("add up to 16") && warning.contains("limits.max_held_requests (10)"), warning)
        XCTAssertFalse(warning.contains("\n"))
        let crowded = try XCTUnwrap(try config(global: 10, routes: [9, nil]).heldRequestShareWarning)
        XCTAssertTrue(crowded.contains("leave 1 of limits.max_held_requests (10) for 2 routes"), crowded)
        XCTAssertEqual(shares(try config(global: 10, routes: [9, nil])), [1, 9, 1])
    }
}
