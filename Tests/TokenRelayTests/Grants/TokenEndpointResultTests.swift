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

    /// A redirect is not the server refusing the refresh token (a wrong URL, http sent to https): the cycle
    /// fails and names the cause, without latching "login required", which no new login could lift.
    func testARedirectFailsTheCycleWithoutDeclaringTheLoginDead() {
        for status in [301, 302, 307, 308] {
            guard case .invalidResponse(let reason, .none) = classify(status, "") else {
                return XCTFail("\(status): \(classify(status, ""))")
            }
            XCTAssertEqual(reason, "token endpoint answered \(status), a redirect (not followed: check refresh.token_url)")
        }
    }

    func testUnusableAnswersSayWhatBecameOfTheRefreshToken() {
        let cases: [(String, TokenEndpointResult.Rotation)] = [
            (#"{"access_token":"a\r\nX: 1","refresh_token":"r2"}"#, .rotated(to: "r2")),
            (#"{"refresh_token":"r2"}"#, .rotated(to: "r2")),
            (#"{"access_token":"a2","refresh_token":"r2","token_type":"MAC"}"#, .rotated(to: "r2")),
            (#"{"access_token":"a b"}"#, .none),
            (#"{"access_token":"a2","refresh_token":"r 2"}"#, .unknown),
            ("garbage", .unknown),
        ]
        for (body, expected) in cases {
            guard case .invalidResponse(_, let rotation) = classify(200, body) else { return XCTFail("accepted \(body)") }
            XCTAssertEqual(rotation, expected, body)
        }
        guard case .rejected = classify(400, #"{"error":"invalid_grant"}"#) else { return XCTFail() }
    }

    /// A DPoP-bound answer is read as a grant marked bound: the token endpoint's client refuses it unless
    /// `dpop` is configured (its message names the missing block; DPoPTests runs that end to end).
    func testADPoPAnswerIsAGrantBoundToTheProofKey() {
        guard case .granted(let grant) = classify(200, #"{"access_token":"a2","refresh_token":"r2","token_type":"DPoP"}"#) else { return XCTFail() }
        XCTAssertTrue(grant.proofBound)
        guard case .granted(let bearer) = classify(200, #"{"access_token":"a2","token_type":"Bearer"}"#) else { return XCTFail() }
        XCTAssertFalse(bearer.proofBound)
        XCTAssertTrue(TokenEndpointResult.dpopNotConfigured.contains(#"add a "dpop" block"#))
    }

    func testLifetimesThatAreNotPositiveAreIgnored() {
        for value in ["0", "-5", "\"soon\"", "true"] {
            guard case .granted(let grant) = classify(200, #"{"access_token":"a2","expires_in":\#(value)}"#) else { return XCTFail(value) }
            XCTAssertNil(grant.expiresIn, value)
            XCTAssertEqual(grant.warnings, ["ignored expires_in: not a positive number of seconds"], value)
        }
        guard case .granted(let bearer) = classify(200, #"{"access_token":"a2","token_type":"bearer","expires_in":60}"#) else { return XCTFail() }
        XCTAssertEqual(bearer.expiresIn, 60)
        XCTAssertTrue(bearer.warnings.isEmpty)
    }
}
