import Foundation
import XCTest
@testable import TokenRelay

/// RFC 6901 evaluation, template escaping and the custom response mapping, without processes.
final class JSONPointerTests: XCTestCase {
    private let document: Any = try! JSONSerialization.jsonObject(with: Data("""
        {"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\\\j": 5, "k\\"l": 6, " ": 7, "m~n": 8,
         "~1": "tilde-one", "data": {"items": [{"t": "x"}]}}
        """.utf8))

    private func value(_ pointer: String) throws -> Any? { try JSONPointer(pointer).evaluate(document) }

    func testRFC6901Examples() throws {
        XCTAssertEqual(try value("/foo/0") as? String, "bar")
        XCTAssertEqual(try value("/") as? Int, 0)
        XCTAssertEqual(try value("/a~1b") as? Int, 1)
        XCTAssertEqual(try value("/c%d") as? Int, 2)
        XCTAssertEqual(try value("/i\\j") as? Int, 5)
        XCTAssertEqual(try value("/k\"l") as? Int, 6)
        XCTAssertEqual(try value("/ ") as? Int, 7)
        XCTAssertEqual(try value("/m~0n") as? Int, 8)
        XCTAssertEqual(try value("/~01") as? String, "tilde-one", "~01 is ~1, not /")
        XCTAssertEqual(try value("/data/items/0/t") as? String, "x")
        XCTAssertNotNil(try value("") as? [String: Any])
    }

    func testMissingAndBadIndices() throws {
        XCTAssertNil(try value("/foo/2"))
        XCTAssertNil(try value("/foo/-"))
        XCTAssertNil(try value("/foo/01"), "leading zeros are not indices")
        XCTAssertNil(try value("/foo/0/x"))
        XCTAssertNil(try value("/nope"))
    }

    func testMalformedPointers() {
        XCTAssertThrowsError(try JSONPointer("data"))
        XCTAssertThrowsError(try JSONPointer("/a~2"))
        XCTAssertThrowsError(try JSONPointer("/a~"))
    }
}

final class CustomGrantRequestTests: XCTestCase {
    private func settings(_ refresh: [String: Any]) throws -> Config.Refresh {
        var full: [String: Any] = ["grant": "custom", "client_id": "app id", "client_secret_env": "S"]
        full.merge(refresh) { _, new in new }
        let object: [String: Any] = ["listen": "127.0.0.1:1", "upstream": ["url": "http://a"], "tokens": ["file": "/t"], "refresh": full]
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object)).refresh
    }

    private let hostile = TokenSet(accessToken: "at", refreshToken: "r\"t\\&=+ x", expiresAt: nil)

    func testJSONBodyEscapesValues() throws {
        let config = try settings(["request": ["url": "http://a/t", "body_json": ["t": "{{refresh_token}}", "s": "pre-{{client_secret}}", "n": 3]],
                                   "response": ["access_token": "/a"]])
        let request = try TokenGrants.make(config, clientSecret: "se\"cret").makeRequest(current: hostile).get()
        let decoded = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any])
        XCTAssertEqual(decoded["t"] as? String, "r\"t\\&=+ x")
        XCTAssertEqual(decoded["s"] as? String, "pre-se\"cret")
        XCTAssertEqual(decoded["n"] as? Int, 3)
        XCTAssertTrue(request.headers.contains { $0.name == "Content-Type" && $0.value == "application/json" })
    }

    func testFormBodyEncodesValues() throws {
        let config = try settings(["request": ["url": "http://a/t", "body_form": ["token": "{{refresh_token}}", "id": "{{client_id}}"]],
                                   "response": ["access_token": "/a"]])
        let request = try TokenGrants.make(config, clientSecret: nil).makeRequest(current: hostile).get()
        XCTAssertEqual(String(decoding: request.body, as: UTF8.self), "id=app%20id&token=r%22t%5C%26%3D%2B%20x")
    }

    func testHeaderValueWithLineBreakIsRefused() throws {
        let config = try settings(["request": ["url": "http://a/t", "headers": ["X-Refresh-Token": "{{refresh_token}}"]],
                                   "response": ["access_token": "/a"]])
        let broken = TokenSet(accessToken: "at", refreshToken: "rt\r\nX-Evil: 1", expiresAt: nil)
        guard case .failure(let failure) = TokenGrants.make(config, clientSecret: nil).makeRequest(current: broken) else {
            return XCTFail("a CR LF must never reach a header")
        }
        XCTAssertFalse(failure.reason.contains("X-Evil"), "the reason must not echo the value")
    }

    func testResponseMapping() throws {
        let config = try settings(["request": ["url": "http://a/t"],
                                   "response": ["access_token": "/d/a", "refresh_token": "/d/r", "expires_at": "/d/at"]])
        let mapping = CustomResponseMapping(settings: config.custom!)
        let now = Date(timeIntervalSince1970: 1_000_000)
        func classify(_ status: Int, _ body: String) -> TokenEndpointResult { mapping.classify(status: status, body: Array(body.utf8), now: now) }
        guard case .granted(let grant) = classify(200, #"{"d":{"a":"A","r":"R","at":1000060}}"#) else { return XCTFail() }
        XCTAssertEqual(grant.accessToken, "A")
        XCTAssertEqual(grant.refreshToken, "R")
        XCTAssertEqual(grant.expiresIn, 60)
        guard case .granted(let rfc3339) = classify(200, #"{"d":{"a":"A","at":"1970-01-12T13:46:00Z"}}"#) else { return XCTFail() }
        XCTAssertNil(rfc3339.expiresIn, "an expiry in the past is ignored: every new token would be due at once")
        XCTAssertEqual(rfc3339.warnings.count, 1)
        XCTAssertNil(rfc3339.refreshToken)
        guard case .rejected = classify(403, "{}") else { return XCTFail("403 is login required by default") }
        guard case .transient = classify(429, "") else { return XCTFail("429 is transient") }
        guard case .invalidResponse = classify(404, "") else { return XCTFail("404 fails the cycle") }
        guard case .invalidResponse = classify(200, #"{"d":{"a":"A B"}}"#) else { return XCTFail("not header-safe") }
    }

    func testClientCredentialsPostForm() throws {
        let object: [String: Any] = ["listen": "127.0.0.1:1", "upstream": ["url": "http://a"], "tokens": ["file": "/t"],
                                     "refresh": ["grant": "client_credentials", "token_url": "http://a/oauth/token", "client_id": "id",
                                                 "client_secret_env": "S", "client_auth": "client_secret_post", "resource": "https://r"]]
        let config = try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object)).refresh
        let request = try TokenGrants.make(config, clientSecret: "s&s").makeRequest(current: TokenSet(accessToken: "")).get()
        XCTAssertEqual(String(decoding: request.body, as: UTF8.self),
                       "grant_type=client_credentials&resource=https%3A%2F%2Fr&client_id=id&client_secret=s%26s")
        XCTAssertFalse(request.headers.contains { $0.name == "Authorization" })
        XCTAssertEqual(request.target, "/oauth/token")
    }
}
