import Foundation
import XCTest

/// Checks the test-support fakes themselves (not the product), so that a product test failing
/// can be trusted to mean a product bug.
final class SupportSmokeTests: XCTestCase {
    private func refresh(_ tokens: FakeTokenServer, _ refreshToken: String) throws -> TestHTTPResponse {
        try HTTPTestClient.send(
            port: tokens.port, method: "POST", path: FakeTokenServer.tokenPath,
            headers: [("Content-Type", "application/x-www-form-urlencoded"),
                      ("Authorization", FakeTokenServer.basicAuthorization(id: "cli ent", secret: "s3cr:et"))],
            body: Data(FakeTokenServer.formEncode([("grant_type", "refresh_token"), ("refresh_token", refreshToken)]).utf8))
    }

    func testTokenServerRotatesAndDetectsReuse() throws {
        let tokens = try FakeTokenServer(clientID: "cli ent", clientSecret: "s3cr:et", accessTokenLifetime: 60)
        defer { tokens.stop() }
        let initial = tokens.issueInitialTokens()
        XCTAssertTrue(tokens.isAccessTokenValid(initial.access))

        let first = try refresh(tokens, initial.refresh)
        XCTAssertEqual(first.status, 200, first.bodyText)
        let json = try XCTUnwrap(first.json())
        let newAccess = try XCTUnwrap(json["access_token"] as? String)
        let newRefresh = try XCTUnwrap(json["refresh_token"] as? String)
        XCTAssertEqual(json["token_type"] as? String, "Bearer")
        XCTAssertEqual(json["expires_in"] as? Int, 60)
        XCTAssertNotEqual(newRefresh, initial.refresh)
        XCTAssertEqual(tokens.currentRefreshToken, newRefresh)
        XCTAssertFalse(tokens.isAccessTokenValid(initial.access))
        XCTAssertTrue(tokens.isAccessTokenValid(newAccess))

        let reuse = try refresh(tokens, initial.refresh) // burnt token presented again
        XCTAssertEqual(reuse.status, 400)
        XCTAssertEqual(reuse.json()?["error"] as? String, "invalid_grant")
        XCTAssertEqual(reuse.json()?["error_description"] as? String, "refresh token reuse detected")
        XCTAssertEqual(tokens.reuseDetections, 1)
        XCTAssertFalse(tokens.isAccessTokenValid(newAccess), "family must be revoked")
        XCTAssertEqual(try refresh(tokens, newRefresh).status, 400, "revoked family cannot refresh")

        XCTAssertEqual(tokens.refreshCalls, 3)
        XCTAssertEqual(tokens.successfulRefreshes, 1)
        XCTAssertEqual(tokens.receivedRequests.first?.bodyText.contains("grant_type=refresh_token"), true)
    }

    func testTokenServerClientAuthAndFailureModes() throws {
        let tokens = try FakeTokenServer(clientID: "id", clientSecret: "secret", accessTokenLifetime: nil,
                                         expectedClientAuth: .post)
        defer { tokens.stop() }
        let initial = tokens.issueInitialTokens()
        func post(_ pairs: [(String, String)]) throws -> TestHTTPResponse {
            try HTTPTestClient.send(port: tokens.port, method: "POST", path: FakeTokenServer.tokenPath,
                                    headers: [("Content-Type", "application/x-www-form-urlencoded")],
                                    body: Data(FakeTokenServer.formEncode(pairs).utf8))
        }
        let grant = [("grant_type", "refresh_token"), ("refresh_token", initial.refresh)]
        let wrong = try post(grant + [("client_id", "id"), ("client_secret", "nope")])
        XCTAssertEqual(wrong.status, 401)
        XCTAssertEqual(wrong.json()?["error"] as? String, "invalid_client")

        tokens.failureMode = .unavailable(status: 503)
        XCTAssertEqual(try post(grant + [("client_id", "id"), ("client_secret", "secret")]).status, 503)
        tokens.failureMode = .normal
        let ok = try post(grant + [("client_id", "id"), ("client_secret", "secret")])
        XCTAssertEqual(ok.status, 200, "503 must not have consumed the refresh token: \(ok.bodyText)")
        XCTAssertNil(ok.json()?["expires_in"])
    }

    func testAPIServerAcceptsIssuedTokenAndRejectsExpiredOne() throws {
        let tokens = try FakeTokenServer()
        let api = try FakeAPIServer(tokenServer: tokens)
        defer { api.stop(); tokens.stop() }
        let access = tokens.issueInitialTokens().access

        let ok = try HTTPTestClient.send(port: api.port, method: "PUT", path: "/v1/items?x=1",
                                         headers: [("Authorization", "Bearer \(access)")], body: Data("hello".utf8))
        XCTAssertEqual(ok.status, 200, ok.bodyText)
        XCTAssertEqual(ok.header("content-type"), "application/json")
        let json = try XCTUnwrap(ok.json())
        XCTAssertEqual(json["method"] as? String, "PUT")
        XCTAssertEqual(json["path"] as? String, "/v1/items")
        XCTAssertEqual(json["body_length"] as? Int, 5)
        XCTAssertEqual(json["body_fnv1a64"] as? String, "a430d84680aabd0b") // FNV-1a 64 of "hello"

        tokens.expireAccessTokens()
        let rejected = try HTTPTestClient.send(port: api.port, method: "GET", path: "/v1/items",
                                               headers: [("Authorization", "Bearer \(access)")])
        XCTAssertEqual(rejected.status, 401)
        XCTAssertEqual(rejected.header("WWW-Authenticate"), "Bearer error=\"invalid_token\"")
        XCTAssertEqual(rejected.json()?["error"] as? String, "invalid_token")
        XCTAssertEqual(try HTTPTestClient.send(port: api.port, method: "GET", path: "/").status, 401)
        XCTAssertEqual(api.requestCount, 3)
        XCTAssertEqual(api.unauthorizedCount, 2)
    }

    func testChunkedRequestBodyAndKeepAlive() throws {
        let tokens = try FakeTokenServer()
        let api = try FakeAPIServer(tokenServer: tokens)
        defer { api.stop(); tokens.stop() }
        let auth = ("Authorization", "Bearer \(tokens.issueInitialTokens().access)")

        let connection = try HTTPTestConnection(port: api.port)
        defer { connection.close() }
        let chunked = Data("5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n".utf8)
        let echo = try connection.send(method: "POST", path: "/echo",
                                       headers: [auth, ("Transfer-Encoding", "chunked")], body: chunked)
        XCTAssertEqual(echo.status, 200)
        XCTAssertEqual(echo.bodyText, "hello, world")
        let second = try connection.send(method: "GET", path: "/again", headers: [auth])
        XCTAssertEqual(second.status, 200)

        let requests = api.requests
        XCTAssertEqual(requests.count, 2)
        XCTAssertTrue(requests[0].wasChunked)
        XCTAssertEqual(requests[0].bodyText, "hello, world")
        XCTAssertEqual(requests[0].connectionID, requests[1].connectionID, "keep-alive must reuse the connection")
    }

    func testConcurrentBurstIsServed() throws {
        let tokens = try FakeTokenServer()
        let api = try FakeAPIServer(tokenServer: tokens)
        defer { api.stop(); tokens.stop() }
        let access = tokens.issueInitialTokens().access
        api.responseDelay = 0.2 // keeps all 60 connections open at the same time
        let results = HTTPTestClient.concurrently(60) { index in
            try HTTPTestClient.send(port: api.port, method: "GET", path: "/n/\(index)",
                                    headers: [("Authorization", "Bearer \(access)")]).status
        }
        XCTAssertEqual(results.compactMap { try? $0.get() }, Array(repeating: 200, count: 60))
        XCTAssertTrue(waitUntil(timeout: 5) { api.requestCount == 60 })
    }
}
