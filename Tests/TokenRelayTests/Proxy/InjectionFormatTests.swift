import Foundation
import XCTest

/// `inject.header` / `inject.format`: the token in a header of the API's choosing, the client's fields of
/// that header dropped, and the refresh cycle (including stale generations) unchanged.
final class InjectionFormatTests: RelayTestCase {
    override func setUpWithError() throws {
        try super.setUpWithError()
        api.stop()
        // The API reads the raw `accessToken` header; an Authorization header is ignored by it.
        api = try FakeAPIServer(tokenServer: tokenServer, tokenHeader: "accessToken")
    }

    private var injectAccessToken: [String: Any] { ["inject": ["header": "accessToken", "format": "{token}"]] }

    func testCustomHeaderEndToEndWithRefresh() throws {
        let relay = try startRelay(injectAccessToken)
        let first = try get(relay, "/one", headers: [("accessToken", "client-forged"), ("Authorization", "Basic Y2xpZW50OnB3")])
        XCTAssertEqual(first.status, 200, first.bodyText)
        let seen = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(seen.headers(named: "accessToken"), [tokenServer.currentAccessToken!], "the client's value is replaced")
        XCTAssertEqual(seen.headers(named: "Authorization"), ["Basic Y2xpZW50OnB3"],
                       "the client's own Authorization is its business when the token goes elsewhere")

        tokenServer.expireAccessTokens()
        let responses = burst(10) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/items/\(i)") }
        XCTAssertEqual(statusCounts(responses), [200: 10])
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(api.requests.last?.header("accessToken"), tokenServer.currentAccessToken)
    }

    func testStaleGenerationReplayWithCustomHeader() throws {
        let relay = try startRelay(injectAccessToken)
        let slow = try requestSpanningARefresh(relay)
        XCTAssertEqual(try slow.wait(timeout: 10).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1, "a 401 for an older generation must not refresh again")
        let attempts = api.requests.filter { $0.path == "/slow" }.map { $0.header("accessToken") }
        XCTAssertEqual(attempts.count, 2)
        XCTAssertNotEqual(attempts[0], attempts[1])
    }

    func testSchemeFormatInAuthorization() throws {
        api.stop()
        let server = tokenServer!
        api = try FakeAPIServer(validateToken: { value in
            value.hasPrefix("Token ") && server.isAccessTokenValid(String(value.dropFirst(6)))
        }, tokenHeader: "Authorization")
        let relay = try startRelay(["inject": ["format": "Token {token}"]])
        XCTAssertEqual(try get(relay, headers: [("authorization", "Bearer forged")]).status, 200)
        XCTAssertEqual(api.requests.last?.headers(named: "Authorization"), ["Token \(tokenServer.currentAccessToken!)"])
    }
}
