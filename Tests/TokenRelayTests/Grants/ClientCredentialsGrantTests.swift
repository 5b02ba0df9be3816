import Foundation
import XCTest

/// `refresh.grant: client_credentials` (RFC 6749 §4.4): no refresh token, a new access token at start
/// (when there is none), on 401 and ahead of expiry, with the same single flight, file and latch.
final class ClientCredentialsGrantTests: RelayTestCase {
    private var clientCredentials: [String: Any] {
        ["refresh": ["grant": "client_credentials", "scope": "api.read", "audience": "https://api.example",
                     "resource": "https://api.example/v1"]]
    }

    func testFetchesATokenAtStartWithoutATokenFile() throws {
        try FileManager.default.removeItem(at: tokenFileURL)
        let relay = try startRelay(clientCredentials)
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.clientCredentialsGrants, 1)

        let request = try XCTUnwrap(tokenServer.receivedRequests.first)
        let form = FakeTokenServer.parseForm(request.bodyText)
        XCTAssertEqual(form["grant_type"], "client_credentials")
        XCTAssertEqual(form["scope"], "api.read")
        XCTAssertEqual(form["audience"], "https://api.example")
        XCTAssertEqual(form["resource"], "https://api.example/v1")
        XCTAssertNil(form["refresh_token"])
        XCTAssertEqual(request.header("Authorization"), FakeTokenServer.basicAuthorization(id: "legacy-app", secret: Self.clientSecret))

        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.readTokenFile()["access_token"] as? String) == self.tokenServer.currentAccessToken })
        let file = try readTokenFile()
        XCTAssertNil(file["refresh_token"], "client_credentials has no refresh token")
        XCTAssertNotNil(file["expires_at"])
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
    }

    func testUnauthorizedBurstFetchesOneNewToken() throws {
        try writeAccessOnlyTokenFile()
        let relay = try startRelay(clientCredentials)
        XCTAssertEqual(try get(relay).status, 200, "the stored token is unknown to the API: 401, new token, replay")
        XCTAssertEqual(api.unauthorizedCount, 1)
        XCTAssertEqual(tokenServer.clientCredentialsGrants, 1)
        tokenServer.expireAccessTokens()

        let responses = burst(20) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/items/\(i)") }

        XCTAssertEqual(statusCounts(responses), [200: 20])
        XCTAssertEqual(tokenServer.clientCredentialsGrants, 2)
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_refreshes_total{outcome=\"success\"} 2"), metrics)
    }

    func testRejectedCredentialsLatchLoginRequired() throws {
        try writeAccessOnlyTokenFile()
        tokenServer.failureMode = .rejectAll
        let relay = try startRelay(clientCredentials)
        XCTAssertEqual(try get(relay).status, 401)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 503 })
        XCTAssertTrue(try get(relay).bodyText.contains("login_required"))
        XCTAssertEqual(tokenServer.refreshCalls, 1, "no retries after a rejection")
    }

    /// A token file without refresh_token is a normal state for this grant.
    private func writeAccessOnlyTokenFile() throws {
        try JSONSerialization.data(withJSONObject: ["access_token": "stale-access-token"]).write(to: tokenFileURL)
        XCTAssertEqual(chmod(tokenFileURL.path, 0o600), 0)
    }
}

/// Ahead of expiry, without any 401, a new client_credentials token replaces the old one.
final class ClientCredentialsProactiveTests: RelayTestCase {
    override var accessTokenLifetime: Double? { 2 }

    func testRefreshesAheadOfExpiry() throws {
        try FileManager.default.removeItem(at: tokenFileURL)
        let relay = try startRelay(["refresh": ["grant": "client_credentials", "skew_seconds": 1]])
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.clientCredentialsGrants >= 2 }, "proactive fetch expected")
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(api.unauthorizedCount, 0)
    }
}
