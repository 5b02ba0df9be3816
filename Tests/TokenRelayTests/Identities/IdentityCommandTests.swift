import Foundation
import XCTest

/// `token show|import --identity NAME` and `login --identity NAME` work on that identity's token file,
/// never on the top-level one; an unknown name is one line naming the identities there are.
final class IdentityCommandTests: RelayTestCase {
    private var tokenFileB: URL { workDir.appendingPathComponent("tokens-b.json") }

    private func writeConfig() throws -> URL {
        var settings = config()
        settings["identities"] = ["b": ["tokens": ["file": tokenFileB.path],
                                        "refresh": ["grant": "refresh_token", "token_url": tokenServer.tokenURL, "client_id": "b-app", "client_auth": "none"],
                                        "login": ["device_authorization_url": tokenServer.baseURL + "/device"]]]
        let url = workDir.appendingPathComponent("config.json")
        try JSONSerialization.data(withJSONObject: settings).write(to: url)
        return url
    }

    func testImportAndShowWorkOnTheNamedIdentitysFile() throws {
        let config = try writeConfig().path
        let before = try Data(contentsOf: tokenFileURL)
        let input = Data(#"{"access_token":"identity-b-access","refresh_token":"identity-b-refresh","expires_in":600}"#.utf8)
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", config, "--identity", "b"], stdin: input)
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)
        XCTAssertFalse(imported.stdout.contains("identity-b-access"))
        let written = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileB)) as? [String: Any])
        XCTAssertEqual(written["refresh_token"] as? String, "identity-b-refresh")
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), before, "the top-level token file is untouched")
        let shown = try TokenRelayProcess.runCommand(arguments: ["token", "show", "--config", config, "--identity", "b"])
        XCTAssertEqual(shown.exitCode, 0, shown.stderr)
        XCTAssertTrue(shown.stdout.contains(tokenFileB.path), shown.stdout)
        XCTAssertFalse(shown.stdout.contains("identity-b-access") || shown.stdout.contains("identity-b-refresh"))
    }

    func testUnknownIdentityIsOneLine() throws {
        let config = try writeConfig().path
        for arguments in [["token", "show"], ["login"]] {
            let result = try TokenRelayProcess.runCommand(arguments: arguments + ["--config", config, "--identity", "nobody"])
            XCTAssertNotEqual(result.exitCode, 0)
            XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
            XCTAssertTrue(result.stderr.contains("--identity: unknown identity \"nobody\" (identities: b)"), result.stderr)
        }
    }
}
