import XCTest
@testable import TokenRelay

final class TokenEndpointResultTests: XCTestCase {
    private func classify(_ status: Int, _ body: String) -> TokenEndpointResult {
        TokenEndpointResult.classify(status: status, body: Array(body.utf8))
    }

    func testGrantWithRotationAndExpiry() {
        guard case .granted(let grant) = classify(200, #"{"access_token":"a2","refresh_token":"r2","expires_in":3600,"token_type":"Bearer"}"#) else {
            return XCTFail("expected a grant")
        }
        XCTAssertEqual(grant.accessToken, "a2")
        XCTAssertEqual(grant.refreshToken, "r2")
        XCTAssertEqual(grant.expiresIn, 3600)
    }

    func testGrantWithoutRefreshTokenKeepsTheOldOne() {
        guard case .granted(let grant) = classify(200, #"{"access_token":"a2","expires_in":"60"}"#) else { return XCTFail() }
        XCTAssertNil(grant.refreshToken)
        XCTAssertEqual(grant.expiresIn, 60)
    }

    func testTokensThatCannotGoInAHeaderAreRefused() {
        for body in [#"{"access_token":"a\r\nX-Evil: 1"}"#, #"{"access_token":"a b"}"#, #"{"access_token":""}"#, #"{"token":"x"}"#, "[]", "garbage"] {
            guard case .invalidResponse = classify(200, body) else { return XCTFail("accepted \(body)") }
        }
    }

    func testRejectionsAndTransientFailures() {
        guard case .rejected(400, "invalid_grant") = classify(400, #"{"error":"invalid_grant","error_description":"x"}"#) else { return XCTFail() }
        guard case .rejected(401, "invalid_client") = classify(401, #"{"error":"invalid_client"}"#) else { return XCTFail() }
        guard case .rejected(403, nil) = classify(403, "<html>") else { return XCTFail() }
        for status in [500, 502, 503, 429] {
            guard case .transient(_, false) = classify(status, "") else { return XCTFail("\(status) not transient") }
        }
    }
}
