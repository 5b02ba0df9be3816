import Foundation
import XCTest
@testable import TokenRelay

/// A config whose routes all name an identity needs no top-level `tokens` and `refresh` (the issue's own
/// example has only `routes` and `identities`); what would leave a route without a token is one line
/// naming the field.
final class IdentitiesOnlyConfigTests: XCTestCase {
    private func refresh(_ tokenURL: String) -> [String: Any] {
        ["grant": "refresh_token", "token_url": tokenURL, "client_id": "legacy-app", "client_auth": "none"]
    }

    /// The issue's example, with a listen address and nothing else at the top level.
    private var issueExample: [String: Any] {
        [
            "listen": "127.0.0.1:8080",
            "routes": [
                ["name": "hr", "match": ["path_prefix": "/hr/", "strip_prefix": true], "upstream": ["url": "https://hr.internal"], "identity": "hr"],
                ["name": "payments", "listen": "127.0.0.1:8091", "upstream": ["url": "https://pay.internal/v2"], "identity": "payments",
                 "inject": ["header": "Authorization", "format": "Bearer {token}"]],
            ],
            "identities": [
                "hr": ["tokens": ["file": "/var/lib/tokenrelay/hr.json"], "refresh": refresh("https://idp.hr/token")],
                "payments": ["tokens": ["redis": ["url": "redis://127.0.0.1:6379/0", "key": "tokenrelay:payments"]],
                             "refresh": refresh("https://idp.pay/token")],
            ],
        ]
    }

    private func parse(_ object: [String: Any]) throws -> Config {
        try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    private func refusal(_ object: [String: Any], file: StaticString = #filePath, line: UInt = #line) -> String {
        do {
            _ = try parse(object)
            XCTFail("accepted", file: file, line: line)
            return ""
        } catch {
            let text = "\(error)"
            XCTAssertFalse(text.contains("\n"), "one line: \(text)", file: file, line: line)
            return text
        }
    }

    func testTheIssuesExampleHasNoTopLevelIdentity() throws {
        let config = try parse(issueExample)
        XCTAssertFalse(config.hasDefaultIdentity)
        XCTAssertFalse(config.hasDefaultRoute)
        XCTAssertNil(config.tokens.file, "no top-level token file stands in")
        XCTAssertNil(config.tokens.redis)
        XCTAssertEqual(config.identities.map(\.name), ["hr", "payments"])
        // Each identity seen as a config has its identity at the top, as before.
        let hr = try config.scoped(toIdentityNamed: "hr")
        XCTAssertTrue(hr.hasDefaultIdentity)
        XCTAssertEqual(hr.tokens.file, "/var/lib/tokenrelay/hr.json")
        // The CLI without --identity: nothing to fall back on.
        XCTAssertThrowsError(try config.scoped(toIdentityNamed: nil)) { error in
            XCTAssertEqual("\(error)", "--identity: is required: this config has no top-level tokens (identities: hr, payments)")
        }
    }

    func testARouteNamingNoIdentityIsRefused() {
        var object = issueExample
        object["routes"] = [["name": "hr", "match": ["path_prefix": "/hr/"], "upstream": ["url": "https://hr.internal"], "identity": "hr"],
                            ["name": "docs", "match": ["host": "docs.internal"], "upstream": ["url": "http://docs.internal"]]]
        XCTAssertEqual(refusal(object), "routes[1].identity: is required: there are no top-level tokens and refresh for the route to use "
                       + "(identities: hr, payments)")
    }

    func testTopLevelUpstreamOrRefreshWithoutTokensIsRefused() {
        var withUpstream = issueExample
        withUpstream["upstream"] = ["url": "http://127.0.0.1:9000"]
        XCTAssertTrue(refusal(withUpstream).hasPrefix("upstream: is the top-level route, whose token is the top-level identity's"))
        for field in ["refresh", "dpop"] {
            var object = issueExample
            object[field] = field == "refresh" ? refresh("https://idp/token") : ["alg": "ES256"]
            XCTAssertTrue(refusal(object).hasPrefix("\(field): belongs to the top-level identity, which needs tokens too"), field)
        }
    }

    func testWithoutIdentitiesTokensAreRequiredAsBefore() {
        var object = issueExample
        object["identities"] = nil
        object["routes"] = nil
        object["upstream"] = ["url": "http://127.0.0.1:9000"]
        XCTAssertEqual(refusal(object), "tokens: is required")
        // A misspelt tokens is named, not taken for a config without a top-level identity.
        var misspelt = issueExample
        misspelt["token"] = ["file": "/var/lib/tokenrelay/tokens.json"]
        XCTAssertEqual(refusal(misspelt), "token: unknown key (did you mean tokens?)")
    }

    /// The top-level identity's store is opened at start: a reload adding or removing it is refused whole,
    /// the running config kept.
    func testAReloadAddingOrRemovingTheTopLevelIdentityIsRefused() throws {
        let without = try parse(issueExample)
        var object = issueExample
        object["tokens"] = ["file": "/var/lib/tokenrelay/tokens.json"]
        object["refresh"] = refresh("https://idp/token")
        let with = try parse(object)
        XCTAssertTrue(with.hasDefaultIdentity)
        for (running, loaded, verb) in [(without, with, "adds a"), (with, without, "removes the")] {
            let plan = ConfigReload(running: running, loaded: loaded)
            XCTAssertThrowsError(try plan.validate()) { error in
                XCTAssertEqual("\(error)", "tokens: the reload \(verb) top-level identity (tokens, refresh); that needs a restart")
            }
            XCTAssertEqual(plan.effective.hasDefaultIdentity, running.hasDefaultIdentity, "the running config stays")
            XCTAssertEqual(plan.needsRestart, [])
        }
        XCTAssertNoThrow(try ConfigReload(running: without, loaded: without).validate())
    }
}
