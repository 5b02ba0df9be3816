import Foundation
import XCTest
@testable import TokenRelay

/// A misspelt config key is named as unknown before anything it made "missing", with the spelling it
/// was probably meant to have.
final class KeySpellingTests: XCTestCase {
    private let valid: [String: Any] = [
        "listen": "127.0.0.1:8080",
        "upstream": ["url": "http://127.0.0.1:9000"],
        "tokens": ["file": "/var/lib/tokenrelay/tokens.json"],
        "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "legacy-app",
                    "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
    ]

    private func error(_ edit: (inout [String: Any]) -> Void) -> String? {
        var object = valid
        edit(&object)
        do {
            _ = try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
            return nil
        } catch {
            return "\(error)"
        }
    }

    private func editRefresh(_ body: @escaping (inout [String: Any]) -> Void) -> (inout [String: Any]) -> Void {
        { object in
            var refresh = object["refresh"] as! [String: Any]
            body(&refresh)
            object["refresh"] = refresh
        }
    }

    func testOneEditAway() {
        XCTAssertTrue(KeySpelling.isOneEditAway("clinet_id", "client_id"), "adjacent swap")
        XCTAssertTrue(KeySpelling.isOneEditAway("client_ld", "client_id"), "replacement")
        XCTAssertTrue(KeySpelling.isOneEditAway("clientid", "client_id"), "deletion")
        XCTAssertTrue(KeySpelling.isOneEditAway("client__id", "client_id"), "insertion")
        XCTAssertTrue(KeySpelling.isOneEditAway("lsiten", "listen"), "swap at the start")
        XCTAssertTrue(KeySpelling.isOneEditAway("listne", "listen"), "swap at the end")
        XCTAssertFalse(KeySpelling.isOneEditAway("client_id", "client_id"), "the same key is no typo")
        XCTAssertFalse(KeySpelling.isOneEditAway("cilent_di", "client_id"), "two swaps")
        XCTAssertFalse(KeySpelling.isOneEditAway("clientid_", "client_id"), "a move is two edits")
        XCTAssertFalse(KeySpelling.isOneEditAway("scope", "client_id"))
        XCTAssertFalse(KeySpelling.isOneEditAway("", "ab"))
        XCTAssertTrue(KeySpelling.isOneEditAway("", "a"))
    }

    func testOtherCaseStylesCount() {
        XCTAssertTrue(KeySpelling.isLikelyMisspelling("clientId", of: "client_id"))
        XCTAssertTrue(KeySpelling.isLikelyMisspelling("Client-ID", of: "client_id"))
        XCTAssertTrue(KeySpelling.isLikelyMisspelling("tokenUrl", of: "token_url"))
        XCTAssertFalse(KeySpelling.isLikelyMisspelling("client_id", of: "client_id"))
        XCTAssertFalse(KeySpelling.isLikelyMisspelling("clientSecret", of: "client_id"))
    }

    /// The case from the issue: the typo replaces the key, which used to read "refresh.client_id: is required".
    func testMisspeltRequiredKeyIsNamedFirst() {
        let message = error(editRefresh { $0["clinet_id"] = $0.removeValue(forKey: "client_id") })
        XCTAssertEqual(message, "refresh.clinet_id: unknown key (did you mean client_id?)")
        XCTAssertEqual(error { $0["lsiten"] = $0.removeValue(forKey: "listen") }, "lsiten: unknown key (did you mean listen?)")
        XCTAssertEqual(error { $0["upstrem"] = $0.removeValue(forKey: "upstream") }, "upstrem: unknown key (did you mean upstream?)")
        XCTAssertEqual(error(editRefresh { $0["clientId"] = $0.removeValue(forKey: "client_id") }),
                       "refresh.clientId: unknown key (did you mean client_id?)")
    }

    func testMisspeltOptionalKeyGetsASuggestion() {
        XCTAssertEqual(error(editRefresh { $0["max_attemps"] = 3 }), "refresh.max_attemps: unknown key (did you mean max_attempts?)")
        XCTAssertEqual(error { $0["limits"] = ["max_body_byte": 1] }, "limits.max_body_byte: unknown key (did you mean max_body_bytes?)")
    }

    func testUnrelatedUnknownKeyHasNoSuggestion() {
        XCTAssertEqual(error { $0["limits"] = ["max_body": 1] }, "limits.max_body: unknown key")
    }

    /// Any unknown key of an object comes before a required key missing from it, typo or not.
    func testUnknownKeyComesBeforeAMissingOne() {
        XCTAssertEqual(error(editRefresh { $0.removeValue(forKey: "client_id"); $0["colour"] = "blue" }), "refresh.colour: unknown key")
        XCTAssertEqual(error { $0.removeValue(forKey: "tokens"); $0["limts"] = [:] }, "limts: unknown key (did you mean limits?)")
        XCTAssertEqual(error { $0["upstream"] = ["adress": "http://x"] }, "upstream.adress: unknown key")
    }

    func testMissingKeyWithoutTypoIsStillRequired() {
        XCTAssertEqual(error(editRefresh { $0.removeValue(forKey: "client_id") }), "refresh.client_id: is required")
    }
}
