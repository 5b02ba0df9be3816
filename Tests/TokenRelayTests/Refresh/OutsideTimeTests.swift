import Foundation
import XCTest
@testable import TokenRelay

/// Times and durations from outside (a token endpoint's `expires_in`, a JWT's `exp`, the token file) can
/// be absurdly large. They are clamped where they are read, and nothing that turns one into a timer may
/// trap: a crash loses every held request, and a token file holding such a token would crash every start.
final class OutsideTimeTests: RelayTestCase {
    private static let huge = 1e19

    static func jwt(exp: Double) -> String {
        func encode(_ object: [String: Any]) -> String {
            (try! JSONSerialization.data(withJSONObject: object)).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }
        return "\(encode(["alg": "none"])).\(encode(["exp": exp, "sub": "x"])).sig"
    }

    // MARK: - In process

    func testHugeExpiresInIsClampedWithAWarning() throws {
        let body = Array(#"{"access_token":"a","expires_in":1e19}"#.utf8)
        guard case .granted(let grant) = TokenEndpointResult.classify(status: 200, body: body) else { return XCTFail("not granted") }
        XCTAssertEqual(grant.expiresIn, TokenExpiry.longestLifetime)
        XCTAssertTrue(grant.warnings.contains { $0.contains("clamped expires_in") }, "\(grant.warnings)")
        let renewed = TokenSet(accessToken: "old").renewed(by: grant, now: Date(timeIntervalSince1970: 0))
        XCTAssertEqual(renewed.lifetime, TokenExpiry.longestLifetime)
    }

    /// A number beyond a Double is valid JSON: the answer (and its rotated refresh token) must be read,
    /// not taken for an unreadable 2xx.
    func testANumberBeyondADoubleDoesNotMakeTheAnswerUnreadable() throws {
        let body = Array(#"{"access_token":"a","refresh_token":"r2","expires_in":1e400,"note":"1e400 in a string stays"}"#.utf8)
        guard case .granted(let grant) = TokenEndpointResult.classify(status: 200, body: body) else { return XCTFail("not granted") }
        XCTAssertEqual(grant.refreshToken, "r2")
        XCTAssertEqual(grant.expiresIn, TokenExpiry.longestLifetime)
        let bounded = try XCTUnwrap(TokenEndpointJSON.boundingNumbers(body))
        XCTAssertTrue(String(decoding: bounded, as: UTF8.self).contains(#""note":"1e400 in a string stays""#))
        XCTAssertNil(TokenEndpointJSON.boundingNumbers(Array(#"{"a":1.5e3}"#.utf8)))
    }

    func testHugeJWTExpIsClampedWithAWarning() throws {
        let now = Date()
        let token = Self.jwt(exp: Self.huge)
        let expiry = TokenExpiry.forStoredTokens(TokenSet(accessToken: token), now: now)
        XCTAssertEqual(try XCTUnwrap(expiry.expiresAt).timeIntervalSince(now), TokenExpiry.longestLifetime, accuracy: 1)
        XCTAssertNotNil(TokenExpiry.clampWarning(for: TokenSet(accessToken: token), now: now))
        XCTAssertNil(TokenExpiry.clampWarning(for: TokenSet(accessToken: Self.jwt(exp: now.timeIntervalSince1970 + 3600)), now: now))
        guard case .granted(let grant) = TokenEndpointResult.classify(status: 200, body: Array("{\"access_token\":\"\(token)\"}".utf8)) else {
            return XCTFail("not granted")
        }
        XCTAssertTrue(grant.warnings.contains { $0.contains("JWT exp") }, "\(grant.warnings)")
    }

    func testTimersNeverTrapOnAnyDouble() {
        for seconds in [Self.huge, .infinity, -.infinity, .nan, -5, Double.greatestFiniteMagnitude] {
            let bounded = TimerDuration.clamped(seconds)
            XCTAssertTrue(bounded >= 0 && bounded <= TimerDuration.longestSeconds, "\(seconds) -> \(bounded)")
            XCTAssertGreaterThanOrEqual(Int(bounded), 0)
        }
        XCTAssertEqual(TokenFileReport.duration(Self.huge).isEmpty, false)
        for seconds in [Double.nan, .infinity, 62_135_596_800 /* year 1 to 1970 */] {
            XCTAssertEqual(TokenFileReport.duration(seconds), "over 10 years", "a clamped figure is not printed as the real one")
        }
        XCTAssertEqual(TokenFileReport.duration(90_061), "1d 1h")
        XCTAssertEqual(TokenFileReport.duration(-3), "0s")
    }

    // MARK: - The real binary

    func testTokenEndpointAnsweringAHugeLifetimeDoesNotCrashTheRelay() throws {
        let endpoint = try MiniHTTPServer { _ in .json(200, ["access_token": "access-huge", "refresh_token": "refresh-huge", "expires_in": Self.huge]) }
        defer { endpoint.stop() }
        let relay = try startRelay(["refresh": ["token_url": "\(endpoint.baseURL)/token"]])
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("clamped expires_in") }, relay.stderrText)
        XCTAssertTrue(relay.isRunning, relay.stderrText)
        XCTAssertEqual(try admin(relay, "/healthz").status, 200)
    }

    func testTokenFileWithAHugeJWTExpWorksInEveryCommand() throws {
        let token = Self.jwt(exp: Self.huge)
        try writeTokenFile(at: tokenFileURL, access: token, refresh: tokenServer.currentRefreshToken!)
        let configURL = workDir.appendingPathComponent("huge-exp.json")
        try JSONSerialization.data(withJSONObject: config()).write(to: configURL)
        let environment = ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret]

        let check = try TokenRelayProcess.runCommand(arguments: ["check", "--config", configURL.path], environment: environment)
        XCTAssertEqual(check.exitCode, 0, check.stderr)
        XCTAssertTrue(check.stdout.contains("WARNING: the access token's JWT exp is more than 366 days away"), check.stdout)

        let show = try TokenRelayProcess.runCommand(arguments: ["token", "show", "--config", configURL.path])
        XCTAssertEqual(show.exitCode, 0, show.stderr)

        let input = try JSONSerialization.data(withJSONObject: ["access_token": token, "refresh_token": "r-imported"])
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path], stdin: input)
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)

        let relay = try startRelay()
        XCTAssertTrue(relay.stderrText.contains("token file: the access token's JWT exp"), relay.stderrText)
        XCTAssertEqual(try admin(relay, "/healthz").status, 200)
        // Adopted through the file watch as well.
        try writeTokenFile(at: tokenFileURL, access: Self.jwt(exp: Self.huge + 1), refresh: "r-adopted")
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("adopted tokens written to the token file") }, relay.stderrText)
        XCTAssertEqual(try admin(relay, "/healthz").status, 200)
        XCTAssertTrue(relay.isRunning)
    }
}
