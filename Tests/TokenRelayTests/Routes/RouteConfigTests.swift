import Foundation
import XCTest
@testable import TokenRelay

/// `routes` and `identities`: parsed with the same readers as the top level, checked against each other,
/// every refusal one line naming the field (and both parties of a clash).
final class RouteConfigTests: XCTestCase {
    private func refresh(_ tokenURL: String) -> [String: Any] {
        ["grant": "refresh_token", "token_url": tokenURL, "client_id": "legacy-app",
         "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"]
    }

    private var base: [String: Any] {
        [
            "listen": "127.0.0.1:8080",
            "upstream": ["url": "http://127.0.0.1:9000"],
            "tokens": ["file": "/var/lib/tokenrelay/tokens.json"],
            "refresh": refresh("http://127.0.0.1:9001/oauth/token"),
            "admin": ["listen": "127.0.0.1:8081"],
        ]
    }

    private var twoIdentities: [String: Any] {
        var config = base
        config["routes"] = [
            ["name": "hr", "match": ["path_prefix": "/hr/", "strip_prefix": true], "upstream": ["url": "https://hr.internal"], "identity": "hr"],
            ["name": "payments", "listen": "127.0.0.1:8091", "upstream": ["url": "https://pay.internal/v2"], "identity": "payments",
             "inject": ["header": "X-Api-Token", "format": "{token}"]],
            ["name": "docs", "match": ["host": "Docs.Internal"], "upstream": ["url": "http://docs.internal"]],
        ]
        config["identities"] = [
            "hr": ["tokens": ["file": "/var/lib/tokenrelay/hr.json"], "refresh": refresh("https://idp.hr/token")],
            "payments": ["tokens": ["redis": ["url": "redis://127.0.0.1:6379/0", "key": "tokenrelay:payments"]],
                         "refresh": refresh("https://idp.pay/token")],
        ]
        return config
    }

    private func parse(_ object: [String: Any]) throws -> Config {
        try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    private func assertRefused(_ object: [String: Any], field: String, mentioning texts: [String] = [],
                               file: StaticString = #filePath, line: UInt = #line) {
        do {
            _ = try parse(object)
            XCTFail("accepted; expected an error at \(field)", file: file, line: line)
        } catch let error as ConfigError {
            XCTAssertEqual(error.field, field, "\(error)", file: file, line: line)
            XCTAssertFalse(error.description.contains("\n"), "one line: \(error)", file: file, line: line)
            for text in texts { XCTAssertTrue(error.description.contains(text), "expected \(text) in \(error)", file: file, line: line) }
        } catch {
            XCTFail("unexpected \(error)", file: file, line: line)
        }
    }

    private func editing(_ config: [String: Any], route index: Int, _ edit: (inout [String: Any]) -> Void) -> [String: Any] {
        var copy = config
        var routes = copy["routes"] as! [[String: Any]]
        edit(&routes[index])
        copy["routes"] = routes
        return copy
    }

    private func editing(_ config: [String: Any], identity name: String, _ edit: (inout [String: Any]) -> Void) -> [String: Any] {
        var copy = config
        var identities = copy["identities"] as! [String: Any]
        var identity = identities[name] as! [String: Any]
        edit(&identity)
        identities[name] = identity
        copy["identities"] = identities
        return copy
    }

    func testTopLevelOnlyIsTheSingleDefaultRoute() throws {
        let config = try parse(base)
        XCTAssertTrue(config.routes.isEmpty)
        XCTAssertTrue(config.identities.isEmpty)
        XCTAssertTrue(config.hasDefaultRoute)
        XCTAssertEqual(config.identityTokens(nil).tokens.file, "/var/lib/tokenrelay/tokens.json")
    }

    func testRoutesAndIdentitiesParse() throws {
        let config = try parse(twoIdentities)
        XCTAssertEqual(config.routes.map(\.name), ["hr", "payments", "docs"])
        XCTAssertEqual(config.routes[0].match, Config.RouteMatch(host: nil, pathPrefix: "/hr/", stripPrefix: true))
        XCTAssertEqual(config.routes[0].upstream.url.authority, "hr.internal")
        XCTAssertNil(config.routes[0].inject)
        XCTAssertEqual(config.routes[1].listen?.port, 8091)
        XCTAssertNil(config.routes[1].match)
        XCTAssertEqual(config.routes[1].inject?.header, "X-Api-Token")
        XCTAssertEqual(config.routes[2].match?.host, "docs.internal", "hosts compare lower-cased")
        XCTAssertNil(config.routes[2].identity, "no identity: the top-level one")
        XCTAssertEqual(config.identities.map(\.name), ["hr", "payments"])
        XCTAssertEqual(config.identities[0].tokens.file, "/var/lib/tokenrelay/hr.json")
        XCTAssertEqual(config.identities[0].refresh.tokenURL.authority, "idp.hr")
        XCTAssertEqual(config.identities[1].tokens.redis?.key, "tokenrelay:payments")
        XCTAssertEqual(config.identityTokens("payments").refresh.tokenURL.authority, "idp.pay")
        XCTAssertEqual(config.identityTokens(nil).refresh.tokenURL.authority, "127.0.0.1:9001")
    }

    func testRoutesOnlyConfigHasNoDefaultRouteAndNeitherIsRefused() throws {
        var routesOnly = base
        routesOnly["upstream"] = nil
        routesOnly["routes"] = [["name": "docs", "match": ["host": "docs.internal"], "upstream": ["url": "http://docs.internal"],
                                 "inject": ["header": "X-Token", "format": "Token {token}"], "max_held_requests": 7]]
        let config = try parse(routesOnly)
        XCTAssertFalse(config.hasDefaultRoute, "no top-level upstream: a request matching no route gets 404")
        XCTAssertEqual(config.upstream.url.authority, "docs.internal", "the first route's upstream stands in")
        XCTAssertEqual(config.routes[0].inject?.format, "Token {token}")
        XCTAssertEqual(config.routes[0].maxHeldRequests, 7)
        var neither = routesOnly
        neither["routes"] = nil
        assertRefused(neither, field: "upstream")
        var empty = routesOnly
        empty["routes"] = [Any]()
        assertRefused(empty, field: "upstream")
        assertRefused(editing(routesOnly, route: 0) { $0["upstream"] = ["url": "ftp://x"] }, field: "routes[0].upstream.url")
        assertRefused(editing(routesOnly, route: 0) { $0["max_held_requests"] = 0 }, field: "routes[0].max_held_requests")
    }

    func testIdentityBlocksUseTheTopLevelReadersWithTheirOwnPaths() {
        assertRefused(editing(twoIdentities, identity: "hr") { $0["refresh"] = ["grant": "refresh_token", "token_url": "https://x/t", "client_auth": "none"] },
                      field: "identities.hr.refresh.client_id")
        assertRefused(editing(twoIdentities, identity: "hr") { $0["tokens"] = [:] }, field: "identities.hr.tokens.file")
        assertRefused(editing(twoIdentities, identity: "hr") { $0["tokens"] = ["file": "/x.json", "watch_interval": 1] },
                      field: "identities.hr.tokens.watch_interval")
        assertRefused(editing(twoIdentities, identity: "hr") { $0["upstream"] = ["url": "http://x"] }, field: "identities.hr.upstream")
        assertRefused(editing(twoIdentities, route: 0) { $0["upstream"] = ["url": "http://x", "passthrough_prefixes": ["login"]] },
                      field: "routes[0].upstream.passthrough_prefixes[0]")
        assertRefused(editing(twoIdentities, route: 1) { $0["inject"] = ["format": "Bearer"] }, field: "routes[1].inject.format")
    }

    func testSharedTokenFileIsRefusedNamingBoth() {
        let shared = editing(twoIdentities, identity: "payments") { $0["tokens"] = ["file": "/var/lib/tokenrelay/../tokenrelay//hr.json"] }
        assertRefused(shared, field: "identities.payments.tokens.file", mentioning: ["identities.hr.tokens.file", "never share a token file"])
        let withDefault = editing(twoIdentities, identity: "hr") { $0["tokens"] = ["file": "/var/lib/tokenrelay/tokens.json"] }
        assertRefused(withDefault, field: "identities.hr.tokens.file", mentioning: ["tokens.file"])
    }

    func testSharedRedisKeyIsRefusedNamingBoth() {
        let shared = editing(twoIdentities, identity: "hr") {
            $0["tokens"] = ["redis": ["url": "redis://127.0.0.1:6379", "key": "tokenrelay:payments"]]
        }
        assertRefused(shared, field: "identities.payments.tokens.redis.key", mentioning: ["identities.hr.tokens.redis.key", "never share a Redis key"])
        let otherDatabase = editing(twoIdentities, identity: "hr") {
            $0["tokens"] = ["redis": ["url": "redis://127.0.0.1:6379/1", "key": "tokenrelay:payments"]]
        }
        XCTAssertNoThrow(try parse(otherDatabase), "the same key in another database is another key")
    }

    func testRouteRefusals() {
        assertRefused(editing(twoIdentities, route: 2) { $0["identity"] = "hrr" }, field: "routes[2].identity", mentioning: ["\"hrr\"", "hr, payments"])
        assertRefused(editing(twoIdentities, route: 2) { $0["name"] = "hr" }, field: "routes[2].name", mentioning: ["routes[0].name"])
        assertRefused(editing(twoIdentities, route: 2) { $0["name"] = "hr route" }, field: "routes[2].name")
        assertRefused(editing(twoIdentities, route: 2) { $0["name"] = "default" }, field: "routes[2].name", mentioning: ["metrics"])
        assertRefused(editing(twoIdentities, route: 2) { $0["match"] = nil }, field: "routes[2]", mentioning: ["listen", "match"])
        assertRefused(editing(twoIdentities, route: 1) { $0["match"] = ["path_prefix": "/p/"] }, field: "routes[1].match")
        assertRefused(editing(twoIdentities, route: 2) { $0["match"] = [:] }, field: "routes[2].match")
        assertRefused(editing(twoIdentities, route: 2) { $0["match"] = ["host": "a b"] }, field: "routes[2].match.host")
        assertRefused(editing(twoIdentities, route: 2) { $0["match"] = ["host": "docs", "strip_prefix": true] }, field: "routes[2].match.strip_prefix")
        assertRefused(editing(twoIdentities, route: 2) { $0["upstream"] = nil }, field: "routes[2].upstream")
        assertRefused(editing(twoIdentities, route: 2) { $0["mtach"] = ["host": "x"] }, field: "routes[2].mtach")
        assertRefused(editing(twoIdentities, route: 2) { $0["match"] = ["path_prefix": "/hr/"] }, field: "routes[2].match", mentioning: ["routes[0].match"])
        assertRefused(editing(twoIdentities, route: 1) { $0["listen"] = "127.0.0.1:8080" }, field: "routes[1].listen", mentioning: ["listen"])
        assertRefused(editing(twoIdentities, route: 1) { $0["listen"] = "0.0.0.0:8081" }, field: "routes[1].listen", mentioning: ["admin.listen"])
        var notArray = twoIdentities
        notArray["routes"] = ["name": "x"]
        assertRefused(notArray, field: "routes")
        var badIdentityName = twoIdentities
        badIdentityName["identities"] = ["a/b": ["tokens": ["file": "/a.json"], "refresh": refresh("https://x/t")]]
        assertRefused(badIdentityName, field: "identities.a/b")
        badIdentityName["identities"] = ["default": ["tokens": ["file": "/a.json"], "refresh": refresh("https://x/t")]]
        assertRefused(badIdentityName, field: "identities.default", mentioning: ["metrics"])
    }

    func testReloadPlanKeepsAStayingIdentitysTokenStoreAndAppliesTheRest() throws {
        let running = try parse(twoIdentities)
        var loadedObject = editing(twoIdentities, identity: "hr") {
            $0["tokens"] = ["file": "/var/lib/tokenrelay/hr-new.json"]
            $0["refresh"] = self.refresh("https://idp2.hr/token")
        }
        var identities = loadedObject["identities"] as! [String: Any]
        identities["added"] = ["tokens": ["file": "/var/lib/tokenrelay/added.json"], "refresh": refresh("https://idp.added/token")]
        identities["payments"] = nil
        loadedObject["identities"] = identities
        loadedObject["routes"] = (loadedObject["routes"] as! [[String: Any]]).filter { $0["name"] as? String != "payments" }
        // The payments route has its own listener, bound at start: removing it waits for a restart, and the
        // route kept for it cannot lose its identity.
        let removingListener = ConfigReload(running: running, loaded: try parse(loadedObject))
        XCTAssertEqual(removingListener.needsRestart.map(\.field), ["routes[].listen", "identities.hr.tokens"])
        XCTAssertEqual(removingListener.effective.routes.map(\.name), ["hr", "docs", "payments"])
        XCTAssertThrowsError(try removingListener.validate()) { XCTAssertEqual(($0 as? ConfigError)?.field, "routes[2].identity") }
        // Without the listener route in either config, the identity goes live.
        var withoutListener = twoIdentities
        withoutListener["routes"] = (twoIdentities["routes"] as! [[String: Any]]).filter { $0["name"] as? String != "payments" }
        let plan = ConfigReload(running: try parse(withoutListener), loaded: try parse(loadedObject))
        XCTAssertNoThrow(try plan.validate())
        XCTAssertEqual(plan.needsRestart.map(\.field), ["identities.hr.tokens"])
        XCTAssertEqual(plan.effective.identities.map(\.name), ["added", "hr"])
        XCTAssertEqual(plan.effective.identities[1].tokens.file, "/var/lib/tokenrelay/hr.json", "the running token store stays")
        XCTAssertEqual(plan.effective.identities[1].refresh.tokenURL.authority, "idp2.hr", "refresh settings apply")
        XCTAssertFalse(plan.needsRestart.description.contains("secret"))
    }

    /// A staying identity keeps its running token store until a restart, so a reload that hands that store
    /// to another identity (two identities' token files swapped) would leave both running on one store: the
    /// route of one would carry the other's tokens, and one refresh token would go to the other's token
    /// endpoint. Such a reload is refused, naming both.
    func testReloadSwappingTwoIdentitiesTokenFilesIsRefused() throws {
        var running = twoIdentities
        var identities = running["identities"] as! [String: Any]
        identities["payments"] = ["tokens": ["file": "/var/lib/tokenrelay/pay.json"], "refresh": refresh("https://idp.pay/token")]
        running["identities"] = identities
        var swapped = running
        identities["hr"] = ["tokens": ["file": "/var/lib/tokenrelay/pay.json"], "refresh": refresh("https://idp.pay/token")]
        identities["payments"] = ["tokens": ["file": "/var/lib/tokenrelay/hr.json"], "refresh": refresh("https://idp.hr/token")]
        swapped["identities"] = identities
        let plan = ConfigReload(running: try parse(running), loaded: try parse(swapped))
        XCTAssertThrowsError(try plan.validate()) { error in
            let description = "\(error)"
            XCTAssertTrue(description.contains("identities.hr.tokens") && description.contains("identities.payments.tokens"), description)
            XCTAssertTrue(description.contains("restart"), description)
            XCTAssertFalse(description.contains("\n"), description)
        }
        // The top level's file given to an identity while the top level keeps it: refused the same way.
        var topToIdentity = running
        topToIdentity["tokens"] = ["file": "/var/lib/tokenrelay/other.json"]
        identities = running["identities"] as! [String: Any]
        identities["hr"] = ["tokens": ["file": "/var/lib/tokenrelay/tokens.json"], "refresh": refresh("https://idp.hr/token")]
        topToIdentity["identities"] = identities
        XCTAssertThrowsError(try ConfigReload(running: try parse(running), loaded: try parse(topToIdentity)).validate())
    }

    /// A process started without identities keeps its unlabelled metrics; the first identities (and the routes
    /// that came with them) wait for a restart instead of aborting the process at registration.
    func testTheFirstIdentitiesOfAProcessStartedWithoutAnyWaitForARestart() throws {
        var withoutListener = twoIdentities
        withoutListener["routes"] = (twoIdentities["routes"] as! [[String: Any]]).filter { $0["name"] as? String != "payments" }
        let plan = ConfigReload(running: try parse(base), loaded: try parse(withoutListener))
        XCTAssertEqual(plan.needsRestart.map(\.field), ["identities"])
        XCTAssertEqual(plan.effective.identities.count, 0)
        XCTAssertEqual(plan.effective.routes.count, 0, "routes naming the waiting identities wait with them")
        XCTAssertNoThrow(try plan.validate())
        // A process started with identities adds more live (its metrics are labelled from the start).
        XCTAssertEqual(ConfigReload(running: try parse(withoutListener), loaded: try parse(withoutListener)).needsRestart, [])
    }

    func testBadPathPrefixes() {
        for (prefix, reason) in [("hr/", "start with /"), ("/hr?x", "?"), ("/h%72/", "%"), ("/a/../b", ".."), ("/a b", "spaces"), ("/a#b", "#")] {
            assertRefused(editing(twoIdentities, route: 0) { $0["match"] = ["path_prefix": prefix] }, field: "routes[0].match.path_prefix", mentioning: [reason])
        }
    }

    func testCanonicalPathJoinsSpellingsOfOneFile() {
        XCTAssertEqual(RouteChecks.canonicalPath("/nonexistent-dir/a/../b//c.json"), "/nonexistent-dir/b/c.json")
        let temporary = String(cString: realpath(NSTemporaryDirectory(), nil))
        XCTAssertEqual(RouteChecks.canonicalPath(NSTemporaryDirectory() + "/./t.json"), temporary + "/t.json")
    }
}
