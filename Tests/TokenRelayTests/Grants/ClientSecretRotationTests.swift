import Foundation
import XCTest

/// `refresh.client_secret_file` is watched like the token file: a replaced Secret (a Kubernetes Secret
/// update, a vault agent's new file) is used by the next refresh, without a signal or a restart.
final class ClientSecretRotationTests: RelayTestCase {
    private var secretFile: URL { workDir.appendingPathComponent("client_secret") }

    /// Replaces the file the way Secret mounts and agents do: a new file renamed over the old one.
    private func replaceSecretFile(with text: String) throws {
        let temporary = workDir.appendingPathComponent("client_secret.new")
        try Data(text.utf8).write(to: temporary)
        guard rename(temporary.path, secretFile.path) == 0 else { throw TestSupportError(errnoContext: "rename") }
    }

    private func startRelayWithSecretFile() throws -> TokenRelayProcess {
        try Data("\(Self.clientSecret)\n".utf8).write(to: secretFile)
        var object = config()
        var refresh = object["refresh"] as! [String: Any]
        refresh.removeValue(forKey: "client_secret_env")
        refresh["client_secret_file"] = secretFile.path
        object["refresh"] = refresh
        let directory = workDir.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return try TokenRelayProcess.start(config: object, workDir: directory)
    }

    private func lines(_ relay: TokenRelayProcess, containing text: String) -> Int {
        relay.stderrText.split(separator: "\n").filter { $0.contains(text) }.count
    }

    /// The secret presented in the Basic authorization of the token server's last request.
    private func lastPresentedSecret() throws -> String {
        let request = try XCTUnwrap(tokenServer.receivedRequests.last)
        let value = try XCTUnwrap(request.header("Authorization"))
        let pair = String(decoding: try XCTUnwrap(Data(base64Encoded: String(value.dropFirst("Basic ".count)))), as: UTF8.self)
        return FakeTokenServer.formDecode(pair.drop { $0 != ":" }.dropFirst())
    }

    func testReplacedSecretFileIsUsedByTheNextRefresh() throws {
        let relay = try startRelayWithSecretFile()
        defer { relay.stop() }
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/first").status, 200)
        XCTAssertEqual(try lastPresentedSecret(), Self.clientSecret)

        // A half-provisioned file (empty) is reported once and the secret in use stays.
        try replaceSecretFile(with: "")
        XCTAssertTrue(waitUntil(timeout: 10) { self.lines(relay, containing: "ignoring changed client secret file") == 1 }, relay.stderrText)

        let rotated = "rotated-secret-\(UUID().uuidString.prefix(8))"
        tokenServer.clientSecret = rotated  // from now on the old secret gets 401 invalid_client
        try replaceSecretFile(with: rotated + "\n")
        XCTAssertTrue(waitUntil(timeout: 10) { self.lines(relay, containing: "client secret file changed") == 1 }, relay.stderrText)

        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/after-rotation").status, 200, relay.stderrText)
        XCTAssertEqual(try lastPresentedSecret(), rotated, "the refresh authenticated with the new secret")
        XCTAssertEqual(tokenServer.successfulRefreshes, 2)
        XCTAssertFalse(relay.stderrText.contains(rotated), "the new secret never reaches a log line")
    }

    /// The identity provider switches to a new secret before the secret file is updated: the refusal
    /// (invalid_client) latches "client authentication refused", not "login required"; the refresh token is
    /// kept, and updating the file asks again at once, without `POST /refresh`.
    func testSecretSwitchedAtTheServerFirstRecoversWhenTheFileIsUpdated() throws {
        let relay = try startRelayWithSecretFile()
        defer { relay.stop() }
        let rotated = "rotated-secret-\(UUID().uuidString.prefix(8))"
        tokenServer.clientSecret = rotated  // the old secret now gets 401 invalid_client
        tokenServer.expireAccessTokens()
        XCTAssertNotEqual(try get(relay, "/refused").status, 200)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 503 }, relay.stderrText)
        let readiness = try admin(relay, "/readyz")
        XCTAssertTrue(String(decoding: readiness.body, as: UTF8.self).contains("client authentication refused"),
                      String(decoding: readiness.body, as: UTF8.self))
        let status = String(decoding: try admin(relay, "/status").body, as: UTF8.self)
        XCTAssertTrue(status.contains("client authentication refused"), status)
        XCTAssertFalse(status.contains("login required"), status)
        XCTAssertEqual(lines(relay, containing: "client authentication refused"), 1, relay.stderrText)
        XCTAssertNotNil(try readTokenFile()["refresh_token"], "the refresh token is kept")
        XCTAssertEqual(tokenServer.successfulRefreshes, 0)

        try replaceSecretFile(with: rotated + "\n")
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, relay.stderrText)
        XCTAssertEqual(try get(relay, "/recovered").status, 200, relay.stderrText)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "one token request after the change, none forced")
        XCTAssertEqual(try lastPresentedSecret(), rotated)
        XCTAssertFalse(relay.stderrText.contains(rotated), "the new secret never reaches a log line")
    }
}
