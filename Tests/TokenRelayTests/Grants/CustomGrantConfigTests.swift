import Foundation
import XCTest
@testable import TokenRelay

/// Custom-grant checks the JSON Schema cannot express (placeholders deep inside body_json, credentials a
/// template refers to), and what the parsed settings hold.
final class CustomGrantConfigTests: XCTestCase {
    private func config(request: [String: Any], response: [String: Any] = ["access_token": "/data/accessToken"],
                        refreshExtras: [String: Any] = ["client_id": "app", "client_secret_env": "S"]) -> [String: Any] {
        var refresh: [String: Any] = ["grant": "custom", "request": request, "response": response]
        refresh.merge(refreshExtras) { _, new in new }
        return ["listen": "127.0.0.1:8080", "upstream": ["url": "http://127.0.0.1:9000"],
                "tokens": ["file": "/tmp/tokens.json"], "refresh": refresh]
    }

    private func error(_ object: [String: Any]) -> String {
        do {
            _ = try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
            return "no error"
        } catch {
            return "\(error)"
        }
    }

    func testUnknownPlaceholderDeepInBodyJSONNamesItsPath() {
        let text = error(config(request: ["url": "http://a/t", "body_json": ["data": ["tokens": [["value": "{{refreshToken}}"]]]]]))
        XCTAssertTrue(text.hasPrefix("refresh.request.body_json.data.tokens[0].value: unknown placeholder {{refreshToken}}"), text)
    }

    func testPlaceholderInAKeyIsRejected() {
        let text = error(config(request: ["url": "http://a/t", "body_json": ["{{client_id}}": "x"]]))
        XCTAssertTrue(text.contains("placeholders are allowed in string values only"), text)
    }

    func testReferencedCredentialsMustBeConfigured() {
        let request: [String: Any] = ["url": "http://a/t", "body_json": ["id": "{{client_id}}", "secret": "{{client_secret}}"]]
        XCTAssertTrue(error(config(request: request, refreshExtras: ["client_secret_env": "S"])).hasPrefix("refresh.client_id: is required"))
        XCTAssertTrue(error(config(request: request, refreshExtras: ["client_id": "app"])).hasPrefix("refresh.client_secret_env:"))
    }

    func testGETCannotCarryABody() {
        XCTAssertTrue(error(config(request: ["url": "http://a/t", "method": "GET", "body_form": ["a": "b"]]))
            .hasPrefix("refresh.request.method: GET cannot carry"))
    }

    func testParsedSeedStyleSettings() throws {
        let parsed = try ConfigLoader.parse(JSONSerialization.data(withJSONObject: config(
            request: ["url": "https://api.example/auth/token", "headers": ["X-Refresh-Token": "{{refresh_token}}"],
                      "body_json": ["clientId": "{{client_id}}"]],
            response: ["access_token": "/data/accessToken", "refresh_token": "/data/refreshToken", "expires_at": "/data/exp"]))).refresh
        XCTAssertEqual(parsed.grant, .custom)
        XCTAssertEqual(parsed.tokenURL.host, "api.example")
        XCTAssertTrue(parsed.needsRefreshToken)
        let custom = try XCTUnwrap(parsed.custom)
        XCTAssertEqual(custom.method, .post)
        XCTAssertEqual(custom.placeholders, [.refreshToken, .clientID])
        XCTAssertEqual(custom.loginRequiredStatuses, [400, 401, 403])
        guard case .absolute(let pointer)? = custom.expiry else { return XCTFail("expires_at expected") }
        XCTAssertEqual(pointer.tokens, ["data", "exp"])
    }

    func testClientCredentialsAndCustomWithoutRefreshTokenDoNotNeedOne() throws {
        let custom = try ConfigLoader.parse(JSONSerialization.data(withJSONObject: config(
            request: ["url": "http://a/login", "body_form": ["secret": "{{client_secret}}"]]))).refresh
        XCTAssertFalse(custom.needsRefreshToken)
    }
}
