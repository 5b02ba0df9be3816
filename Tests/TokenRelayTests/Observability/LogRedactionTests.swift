import Logging
import XCTest
@testable import TokenRelay

final class LogRedactionTests: XCTestCase {
    /// A secret with characters that logfmt and JSON escape must still be blanked out.
    func testSecretsWithQuotesAndBackslashesAreRedactedInEveryFormat() {
        let redactor = SecretRedactor()
        let secret = #"tok"en\with-quote-9f"#
        redactor.update([secret])
        for format in [LogFormat.text, .json] {
            let handler = LineLogHandler(level: .info, format: format, redactor: redactor)
            let line = handler.render(level: .error, message: "echo \(secret)", metadata: ["body": "\(secret)!"])
            XCTAssertFalse(line.contains("with-quote-9f"), "\(format): \(line)")
            XCTAssertTrue(line.contains("[redacted]"), line)
        }
    }

    func testPreviousTokensStayRedactedAfterRotation() {
        let redactor = SecretRedactor()
        redactor.update(["access-token-one", "refresh-token-one"])
        redactor.update(["access-token-two", "refresh-token-two"])
        XCTAssertEqual(redactor.redact("access-token-one access-token-two"), "[redacted] [redacted]")
    }

    func testOAuthErrorCodesAreSanitised() {
        XCTAssertEqual(OAuthErrorCode.sanitized("invalid_grant"), "invalid_grant")
        XCTAssertEqual(OAuthErrorCode.sanitized("SESSION_EXPIRED"), "SESSION_EXPIRED")
        XCTAssertEqual(OAuthErrorCode.sanitized("refresh token rt-123 was reused"), OAuthErrorCode.unrecognised)
        XCTAssertEqual(OAuthErrorCode.sanitized(String(repeating: "a", count: 65)), OAuthErrorCode.unrecognised)
        guard case .rejected(400, OAuthErrorCode.unrecognised?) = TokenEndpointResult.classify(
            status: 400, body: Array(#"{"error":"bad token eyJhbGciOi.secret"}"#.utf8)) else { return XCTFail() }
    }
}
