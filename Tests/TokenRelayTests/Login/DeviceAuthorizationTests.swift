import Foundation
@testable import TokenRelay
import XCTest

/// Reading the device authorization response and the device-code poll answers (RFC 8628 §3.2, §3.5).
final class DeviceAuthorizationTests: XCTestCase {
    private func parse(_ json: String) throws -> DeviceAuthorization {
        try DeviceAuthorization.parse(Array(json.utf8))
    }

    func testDefaultsAndLenientNumbers() throws {
        let basic = try parse(#"{"device_code":"d","user_code":"U","verification_uri":"https://idp/device","expires_in":"600"}"#)
        XCTAssertEqual(basic.interval, 5, "RFC 8628 default")
        XCTAssertEqual(basic.expiresIn, 600, "a number sent as a string")
        XCTAssertNil(basic.verificationURIComplete)
        let fractional = try parse(#"{"device_code":"d","user_code":"U","verification_url":"https://idp/device","expires_in":1.5,"interval":0.05}"#)
        XCTAssertEqual(fractional.interval, 0.05)
        XCTAssertEqual(fractional.verificationURI, "https://idp/device", "verification_url is accepted")
        let zero = try parse(#"{"device_code":"d","user_code":"U","verification_uri":"https://idp/device","expires_in":60,"interval":0}"#)
        XCTAssertEqual(zero.interval, 5, "no tight polling loop")
    }

    func testMissingOrUnsafeFieldsAreRefused() {
        let cases = [
            (#"[]"#, "not a JSON object"),
            (#"{"user_code":"U","verification_uri":"https://idp","expires_in":60}"#, "no device_code"),
            (#"{"device_code":"d","verification_uri":"https://idp","expires_in":60}"#, "no user_code"),
            (#"{"device_code":"d","user_code":"U","expires_in":60}"#, "no verification_uri"),
            (#"{"device_code":"d","user_code":"U","verification_uri":"https://idp"}"#, "no usable expires_in"),
            (#"{"device_code":"d","user_code":"U\u001b[2J","verification_uri":"https://idp","expires_in":60}"#, "unusable user_code"),
            (#"{"device_code":"d","user_code":"U","verification_uri":"https://idp\nfake line","expires_in":60}"#, "unusable verification_uri"),
        ]
        for (json, expected) in cases {
            XCTAssertThrowsError(try parse(json), json) { error in
                XCTAssertTrue("\(error)".contains(expected), "\(json): \(error)")
                XCTAssertFalse("\(error)".contains("\"d\""), "the device code is never repeated")
            }
        }
    }

    func testPollAnswers() {
        func step(_ status: Int, _ body: String) -> DevicePollStep {
            DevicePollStep.classify(TokenEndpointResult.classify(status: status, body: Array(body.utf8)))
        }
        guard case .pending = step(400, #"{"error":"authorization_pending"}"#) else { return XCTFail("pending") }
        guard case .slowDown = step(400, #"{"error":"slow_down"}"#) else { return XCTFail("slow_down") }
        guard case .transient = step(503, "") else { return XCTFail("5xx is transient") }
        guard case .granted(let grant) = step(200, #"{"access_token":"a","refresh_token":"r","expires_in":60}"#) else { return XCTFail("granted") }
        XCTAssertEqual(grant.refreshToken, "r")
        guard case .failed(let denied) = step(400, #"{"error":"access_denied"}"#) else { return XCTFail("denied") }
        XCTAssertTrue(denied.description.contains("access denied"))
        guard case .failed(let expired) = step(400, #"{"error":"expired_token"}"#) else { return XCTFail("expired") }
        XCTAssertEqual(expired.description, "login: the code expired; run login again")
        guard case .failed(let odd) = step(400, #"{"error":"tok_abc def ghi"}"#) else { return XCTFail("odd code") }
        XCTAssertFalse(odd.description.contains("abc"), "a code that is not shaped like one is not repeated")
    }
}
