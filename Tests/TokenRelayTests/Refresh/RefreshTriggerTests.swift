import Foundation
import XCTest
@testable import TokenRelay

final class RefreshTriggerRuleTests: XCTestCase {
    func testChallengeRules() {
        let triggers: Set<Int> = [401]
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"Bearer error="invalid_token""#], triggerStatuses: triggers))
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [], triggerStatuses: triggers))
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"Bearer realm="api""#], triggerStatuses: triggers))
        XCTAssertFalse(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"Bearer realm="api", error="insufficient_scope""#], triggerStatuses: triggers))
        XCTAssertFalse(RefreshTrigger.indicatesExpiredToken(status: 401, challenges: [#"Bearer error=invalid_request"#], triggerStatuses: triggers))
        XCTAssertFalse(RefreshTrigger.indicatesExpiredToken(status: 403, challenges: [], triggerStatuses: triggers))
        XCTAssertTrue(RefreshTrigger.indicatesExpiredToken(status: 419, challenges: [], triggerStatuses: [401, 419]))
        XCTAssertEqual(RefreshTrigger.bearerError(in: [#"Basic realm="x", Bearer error_description="y", error="invalid_token""#]), "invalid_token")
    }

    func testSkewRules() {
        XCTAssertEqual(TokenExpiry.skew(lifetime: 3600, configured: nil), 300)
        XCTAssertEqual(TokenExpiry.skew(lifetime: 600, configured: nil), 60)
        XCTAssertEqual(TokenExpiry.skew(lifetime: 5, configured: nil), 1)
        XCTAssertEqual(TokenExpiry.skew(lifetime: 1, configured: nil), 0.5)
        XCTAssertEqual(TokenExpiry.skew(lifetime: 10, configured: 600), 5)
    }
}

/// Which upstream responses start a refresh (issue #4), observed end to end.
final class RefreshTriggerTests: RelayTestCase {
    private func answer(_ status: Int, challenge: String?) {
        api.responseOverride = { _ in
            TestResponse(status: status, headers: challenge.map { [("WWW-Authenticate", $0)] } ?? [], body: Data("{}".utf8))
        }
    }

    func testInsufficientScopeIsPassedThroughWithoutRefresh() throws {
        let relay = try startRelay()
        answer(401, challenge: #"Bearer error="insufficient_scope", scope="admin""#)
        let response = try get(relay)
        XCTAssertEqual(response.status, 401)
        XCTAssertEqual(response.header("WWW-Authenticate"), #"Bearer error="insufficient_scope", scope="admin""#)
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }

    func testBareUnauthorizedTriggersRefresh() throws {
        let relay = try startRelay()
        let served = Locked(0)
        api.responseOverride = { _ in served.withLock { $0 += 1; return $0 } == 1 ? TestResponse(status: 401) : nil }
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }

    func testExtraTriggerStatuses() throws {
        let relay = try startRelay(["refresh": ["trigger_statuses": [419]]])
        let served = Locked(0)
        api.responseOverride = { _ in served.withLock { $0 += 1; return $0 } == 1 ? TestResponse(status: 419, reason: "Session Expired") : nil }
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)

        api.responseOverride = { _ in TestResponse(status: 403) }
        XCTAssertEqual(try get(relay).status, 403, "403 is not configured here: passed through")
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }

    func testPassthroughPrefixesAreForwardedUntouched() throws {
        let relay = try startRelay(["upstream": ["passthrough_prefixes": ["/auth/"]]])
        let response = try get(relay, "/auth/login", headers: [("Authorization", "Basic dXNlcjpwdw==")])
        XCTAssertEqual(response.status, 401, "the fake API rejects a Basic credential")
        let seen = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(seen.headers(named: "Authorization"), ["Basic dXNlcjpwdw=="])
        XCTAssertEqual(tokenServer.refreshCalls, 0, "no refresh on a passthrough path")
        XCTAssertEqual(try get(relay, "/data").status, 200)
    }
}

/// A token endpoint that keeps issuing tokens the API rejects must not cause endless refreshing.
final class StormGuardTests: RelayTestCase {
    func testStormGuardTripsAndRecovers() throws {
        let relay = try startRelay(["refresh": ["storm_max_refreshes": 3, "storm_window_seconds": 2]])
        api.responseOverride = { _ in TestResponse(status: 401, headers: [("WWW-Authenticate", #"Bearer error="invalid_token""#)]) }
        for i in 0..<8 { XCTAssertEqual(try get(relay, "/storm/\(i)").status, 401) }
        XCTAssertEqual(tokenServer.refreshCalls, 3, "at most storm_max_refreshes per window")
        let readiness = try admin(relay, "/readyz")
        XCTAssertEqual(readiness.status, 503)
        XCTAssertTrue(readiness.bodyText.contains("storm guard"), readiness.bodyText)
        XCTAssertTrue(try admin(relay, "/metrics").bodyText.contains("tokenrelay_storm_guard_trips_total 1"))

        api.responseOverride = nil
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 200 }, "recovers when the window passes")
        XCTAssertEqual(try get(relay).status, 200)
    }
}
