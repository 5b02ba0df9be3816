import Foundation
import XCTest

/// `identities.<name>.tokens.encryption` at start, as for the top level: a named identity's plain file is
/// sealed before the loop runs (bound to its name), and one sealed with a previous key is resealed with
/// `key_file`, so no identity's tokens stay in clear until its own next refresh.
final class IdentityResealingTests: SecondIdentityTestCase, SealedStateChecks {
    private func withIdentityB(encryption: [String: Any]) -> [String: Any] {
        ["routes": [["name": "b", "match": ["path_prefix": "/b/", "strip_prefix": true], "upstream": ["url": apiB.baseURL], "identity": "b"]],
         "identities": ["b": [
            "tokens": ["file": tokenFileB.path, "encryption": encryption],
            "refresh": ["grant": "refresh_token", "token_url": tokenServerB.tokenURL, "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
         ]]]
    }

    private func logLines(_ relay: TokenRelayProcess, containing text: String) -> [Substring] {
        relay.stderrText.split(separator: "\n").filter { $0.contains(text) }
    }

    func testAnIdentitysPlainFileIsSealedAtStartAndResealedWithARotatedKey() throws {
        let key = try writeKey(workDir, "b-key")
        let topLevelBefore = try Data(contentsOf: tokenFileURL)
        let relay = try startRelay(withIdentityB(encryption: ["key_file": key.url.path]))
        let stored = try Data(contentsOf: tokenFileB)
        XCTAssertEqual(try sealedEnvelope(stored)["key_id"] as? String, try keyID(key.bytes), "b's file sealed at start")
        assertHoldsNone(of: [initialB.access, initialB.refresh], in: stored, "b's token file after the start")
        XCTAssertEqual(try fileMode(tokenFileB), 0o600)
        // Bound to the identity: the associated data names b.
        let opened = try openIndependently(stored, key: key.bytes, associatedData: "tokenrelay token state v1: token file of identity b")
        XCTAssertEqual(opened["refresh_token"] as? String, initialB.refresh)
        let sealedLines = logLines(relay, containing: "token file sealed with tokens.encryption.key_file")
        XCTAssertEqual(sealedLines.count, 1, relay.stderrText)
        XCTAssertTrue(sealedLines.first?.contains("identity=b") ?? false, "\(sealedLines)")
        XCTAssertEqual(try get(relay, "/b/x").status, 200)
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), topLevelBefore, "the top level has no encryption: its file is left as it is")
        relay.stop()

        // A rotated key: the file sealed with the previous one is rewritten with key_file at the next start.
        let next = try writeKey(workDir, "b-key-2", raw: true)
        let again = try startRelay(withIdentityB(encryption: ["key_file": next.url.path, "previous_key_files": [key.url.path]]))
        XCTAssertEqual(try sealedEnvelope(try Data(contentsOf: tokenFileB))["key_id"] as? String, try keyID(next.bytes))
        let resealed = logLines(again, containing: "sealed with the previous key \(try keyID(key.bytes))")
        XCTAssertTrue(resealed.first?.contains("identity=b") ?? false, again.stderrText)
        XCTAssertEqual(try get(again, "/b/y").status, 200)
        XCTAssertEqual(tokenServerB.successfulRefreshes, 0, "resealing needs no refresh")
        XCTAssertEqual(tokenServerB.reuseDetections, 0)
    }
}
