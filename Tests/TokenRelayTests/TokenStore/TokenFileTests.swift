import Foundation
import XCTest
@testable import TokenRelay

final class TokenFileTests: XCTestCase {
    private var directory: String!

    override func setUpWithError() throws {
        directory = NSTemporaryDirectory() + "tokenfile-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(atPath: directory)
    }

    private func write(_ text: String, mode: Int = 0o600) -> TokenFile {
        let path = "\(directory!)/tokens.json"
        _ = FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: mode])
        return TokenFile(path: path)
    }

    func testReadsThePublicFormat() throws {
        let file = write(#"{"access_token":"a1","refresh_token":"r1","expires_at":"2026-11-21T10:00:00Z","note":"hand-made"}"#)
        let tokens = try file.load()
        XCTAssertEqual(tokens.accessToken, "a1")
        XCTAssertEqual(tokens.refreshToken, "r1")
        XCTAssertEqual(tokens.expiresAt, Timestamp.parse("2026-11-21T10:00:00Z"))
        XCTAssertEqual(tokens.otherFields["note"] as? String, "hand-made")
    }

    func testExpiresAtIsOptional() throws {
        XCTAssertNil(try write(#"{"access_token":"a1","refresh_token":"r1"}"#).load().expiresAt)
    }

    func testRewritePreservesUnknownKeysAndIsPrivate() throws {
        let file = write(#"{"access_token":"a1","refresh_token":"r1","note":"keep me"}"#)
        var tokens = try file.load()
        tokens.accessToken = "a2"
        tokens.refreshToken = "r2"
        tokens.expiresAt = Date(timeIntervalSince1970: 1_800_000_000)
        try file.write(tokens)
        let reread = try file.load()
        XCTAssertEqual(reread.accessToken, "a2")
        XCTAssertEqual(reread.refreshToken, "r2")
        XCTAssertEqual(reread.otherFields["note"] as? String, "keep me")
        let mode = try FileManager.default.attributesOfItem(atPath: file.path)[.posixPermissions] as? Int
        XCTAssertEqual(mode, 0o600)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0 != "tokens.json" }
        XCTAssertEqual(leftovers, [], "no temporary file may be left behind")
    }

    func testFileReadableByOthersIsRefused() throws {
        let file = write(#"{"access_token":"a1","refresh_token":"r1"}"#, mode: 0o644)
        XCTAssertThrowsError(try file.checkPermissions()) { error in
            XCTAssertTrue("\(error)".contains("chmod 600"), "\(error)")
            XCTAssertTrue("\(error)".contains(file.path), "\(error)")
        }
    }

    func testBadContentNamesTheFileAndCauseWithoutLeakingTokens() {
        let cases = [
            ("not json", "is not valid JSON"),
            (#"{"access_token":"a""#, "is not valid JSON"),
            ("[]", "is not a JSON object"),
            ("{\"access_token\":\"a\",\n\"refresh_token\":\"secret-refresh-value\",\n}", "is not valid JSON: trailing comma at line 2"),
            (#"{"access_token":"a","refresh_token":"secret-refresh-value","access_token":"b"}"#, "is not valid JSON: duplicate key access_token at line 1"),
            (#"{"access_token":42,"refresh_token":"secret-refresh-value"}"#, "access_token is missing"),
            (#"{"expires_at":"2026-11-21T10:00:00Z"}"#, "access_token is missing"),
            (#"{"access_token":"bad\r\nX-Injected: 1","refresh_token":"r"}"#, "not allowed in an HTTP header"),
            (#"{"access_token":"a","refresh_token":"r","expires_at":"tomorrow"}"#, "expires_at must be"),
        ]
        for (content, expected) in cases {
            let file = write(content)
            XCTAssertThrowsError(try file.load()) { error in
                let text = "\(error)"
                XCTAssertTrue(text.contains(expected), text)
                XCTAssertTrue(text.contains(file.path), text)
                XCTAssertFalse(text.contains("secret-refresh-value"), text)
            }
        }
    }
}
