import Foundation
import XCTest

/// `tokenrelay check` on a config with identities: a token file two identities name is one line naming both;
/// route held-request limits adding up past the global one pass with a warning.
final class RouteCheckCommandTests: RelayTestCase {
    func testSharedTokenFileNamesBothIdentities() throws {
        let shared = workDir.appendingPathComponent("shared.json").path
        let refresh: [String: Any] = ["grant": "refresh_token", "token_url": tokenServer.tokenURL, "client_id": "legacy-app",
                                      "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"]
        var settings = config()
        settings["identities"] = ["a": ["tokens": ["file": shared], "refresh": refresh], "b": ["tokens": ["file": shared], "refresh": refresh]]
        settings["routes"] = [["name": "a", "match": ["path_prefix": "/a/"], "upstream": ["url": api.baseURL], "identity": "a"],
                              ["name": "b", "match": ["path_prefix": "/b/"], "upstream": ["url": api.baseURL], "identity": "b"]]
        let url = workDir.appendingPathComponent("check.json")
        try JSONSerialization.data(withJSONObject: settings).write(to: url)
        let result = try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": RelayTestCase.clientSecret])
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
        XCTAssertTrue(result.stderr.contains("identities.b.tokens.file"), result.stderr)
        XCTAssertTrue(result.stderr.contains("identities.a.tokens.file"), result.stderr)
    }

    func testRouteHeldLimitsBeyondTheGlobalOnePassWithAWarning() throws {
        var settings = config()
        settings["limits"] = ["max_held_requests": 10]
        settings["routes"] = [["name": "a", "match": ["path_prefix": "/a/"], "upstream": ["url": api.baseURL], "max_held_requests": 8],
                              ["name": "b", "match": ["path_prefix": "/b/"], "upstream": ["url": api.baseURL], "max_held_requests": 8]]
        let url = workDir.appendingPathComponent("check.json")
        try JSONSerialization.data(withJSONObject: settings).write(to: url)
        let result = try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": RelayTestCase.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        let output = result.stdout + result.stderr
        XCTAssertTrue(output.contains("ok: config valid"), output)
        XCTAssertTrue(output.contains("WARNING: routes[].max_held_requests add up to 16, more than limits.max_held_requests (10)"), output)
    }
}
