import Foundation
import XCTest

/// `tokenrelay login`: the device authorization grant (RFC 8628) against a fake identity provider.
/// `--poll-interval-scale` shortens the protocol's waits so each test takes well under a second or two.
final class DeviceLoginTests: RelayTestCase {
    private var provider: FakeDeviceAuthorizationServer?

    override func tearDownWithError() throws {
        provider?.stop()
        try super.tearDownWithError()
    }

    private func startProvider(_ script: [FakeDeviceAuthorizationServer.PollAnswer], interval: Double? = 1,
                               expiresIn: Double = 600) throws -> FakeDeviceAuthorizationServer {
        let server = try FakeDeviceAuthorizationServer(script: script, interval: interval, expiresIn: expiresIn)
        provider = server
        return server
    }

    /// A config whose refresh.token_url is the provider's, so login's defaults (token URL, client, scope) apply.
    private func loginConfig(_ provider: FakeDeviceAuthorizationServer, refresh: [String: Any] = [:], login: [String: Any] = [:]) throws -> URL {
        var loginObject: [String: Any] = ["device_authorization_url": provider.deviceAuthorizationURL]
        loginObject.merge(login) { _, new in new }
        var refreshObject: [String: Any] = ["token_url": provider.tokenURL, "scope": "api.read offline_access"]
        refreshObject.merge(refresh) { _, new in new }
        var object = config(["refresh": refreshObject, "login": loginObject])
        if var merged = object["refresh"] as? [String: Any] {
            for (key, value) in refresh where value is NSNull { merged[key] = nil }
            object["refresh"] = merged
        }
        let url = workDir.appendingPathComponent("login-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: object).write(to: url)
        return url
    }

    private func login(_ config: URL, scale: Double = 0.01) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        try TokenRelayProcess.runCommand(arguments: ["login", "--config", config.path, "--poll-interval-scale", String(scale)],
                                         environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret], timeout: 20)
    }

    private func assertNoSecrets(_ result: (exitCode: Int32, stdout: String, stderr: String), _ secrets: [String],
                                 file: StaticString = #filePath, line: UInt = #line) {
        for secret in secrets + [FakeDeviceAuthorizationServer.deviceCode, Self.clientSecret] {
            XCTAssertFalse(result.stdout.contains(secret) || result.stderr.contains(secret), "\(secret) leaked", file: file, line: line)
        }
    }

    func testSuccessAfterPendingAndSlowDownWritesAPrivateTokenFile() throws {
        try JSONSerialization.data(withJSONObject: ["access_token": "old", "refresh_token": "old-r", "note": "kept"]).write(to: tokenFileURL)
        let provider = try startProvider([.pending, .pending, .slowDown, .pending,
                                          .tokens(access: "login-access-1", refresh: "login-refresh-1", expiresIn: 3600)], interval: 2)
        let result = try login(try loginConfig(provider))

        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains(provider.verificationURI), result.stdout)
        XCTAssertTrue(result.stdout.contains(FakeDeviceAuthorizationServer.userCode), result.stdout)
        XCTAssertTrue(result.stdout.contains("?user_code=\(FakeDeviceAuthorizationServer.userCode)"), "complete URI shown: \(result.stdout)")
        XCTAssertTrue(result.stdout.contains("logged in; tokens written to \(tokenFileURL.path)"), result.stdout)
        assertNoSecrets(result, ["login-access-1", "login-refresh-1", "id-token-not-stored"])

        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
        let file = try readTokenFile()
        XCTAssertEqual(file["access_token"] as? String, "login-access-1")
        XCTAssertEqual(file["refresh_token"] as? String, "login-refresh-1")
        XCTAssertEqual(file["note"] as? String, "kept", "unknown keys of the old file survive")
        XCTAssertNil(file["id_token"], "nothing beyond the tokens is taken from the answer")
        let expiresAt = try XCTUnwrap(ISO8601DateFormatter().date(from: try XCTUnwrap(file["expires_at"] as? String)))
        XCTAssertEqual(expiresAt.timeIntervalSinceNow, 3600, accuracy: 60)

        // The requests: client authentication as refresh.client_auth says, scope from refresh.scope.
        let arrivals = provider.arrivals
        XCTAssertEqual(arrivals.map(\.request.path), ["/device", "/token", "/token", "/token", "/token", "/token"])
        let basic = "Basic " + Data("legacy-app:\(Self.clientSecret)".utf8).base64EncodedString()
        XCTAssertTrue(arrivals.allSatisfy { $0.request.header("Authorization") == basic })
        XCTAssertEqual(FakeTokenServer.parseForm(arrivals[0].request.bodyText), ["scope": "api.read offline_access"])
        XCTAssertEqual(FakeTokenServer.parseForm(arrivals[1].request.bodyText),
                       ["grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": FakeDeviceAuthorizationServer.deviceCode])

        // Spacing: 2 s scaled to 20 ms until slow_down, then 7 s scaled to 70 ms (lower bounds only:
        // a loaded machine can only make the gaps longer).
        let times = provider.polls.map(\.time)
        let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
        XCTAssertEqual(gaps.count, 4)
        XCTAssertTrue(gaps.prefix(2).allSatisfy { $0 >= 0.019 }, "\(gaps)")
        XCTAssertTrue(gaps.suffix(2).allSatisfy { $0 >= 0.069 }, "slow_down adds 5 s to the interval: \(gaps)")
    }

    func testPublicClientSendsItsIdAndLoginOverrides() throws {
        let provider = try startProvider([.tokens(access: "a-2", refresh: "r-2", expiresIn: nil)], interval: 0.05)
        let config = try loginConfig(provider, refresh: ["client_auth": "none", "client_secret_env": NSNull(), "token_url": tokenServer.tokenURL],
                                     login: ["token_url": provider.tokenURL, "client_id": "device-app", "scope": "openid offline_access"])
        let result = try login(config, scale: 1) // a fractional interval from the server is honoured as is
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        let arrivals = provider.arrivals
        XCTAssertNil(arrivals[0].request.header("Authorization"))
        XCTAssertEqual(FakeTokenServer.parseForm(arrivals[0].request.bodyText), ["client_id": "device-app", "scope": "openid offline_access"])
        XCTAssertEqual(FakeTokenServer.parseForm(arrivals[1].request.bodyText)["client_id"], "device-app")
        XCTAssertNil(try readTokenFile()["expires_at"], "no expires_in, not a JWT: expiry unknown")
    }

    /// RFC 8628 §3.5: a 5xx or a lost connection does not end the login; polling goes on, further apart.
    func testTransientFailuresKeepPolling() throws {
        let provider = try startProvider([.error("server_error", status: 503), .error("temporarily_unavailable", status: 503), .pending,
                                          .tokens(access: "a-3", refresh: "r-3", expiresIn: 60)])
        let result = try login(try loginConfig(provider))
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertEqual(provider.polls.count, 4)
        let times = provider.polls.map(\.time)
        XCTAssertGreaterThanOrEqual(times[2] - times[1], 0.039, "the interval doubles after a failure")
    }

    func testAccessDeniedFailsAndLeavesTheTokenFileAlone() throws {
        let before = try Data(contentsOf: tokenFileURL)
        let provider = try startProvider([.pending, .error("access_denied")])
        let result = try login(try loginConfig(provider))
        XCTAssertEqual(result.exitCode, 1)
        XCTAssertEqual(result.stderr, "tokenrelay: login: access denied: the sign-in was declined\n")
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), before)
        assertNoSecrets(result, [])
    }

    func testExpiredTokenFromTheServer() throws {
        let provider = try startProvider([.error("expired_token")])
        let result = try login(try loginConfig(provider))
        XCTAssertEqual(result.exitCode, 1)
        XCTAssertEqual(result.stderr, "tokenrelay: login: the code expired; run login again\n")
    }

    func testCodeExpiresLocallyWhileThePollIsPending() throws {
        let provider = try startProvider([.pending], interval: 0.05, expiresIn: 0.4)
        let result = try login(try loginConfig(provider), scale: 1)
        XCTAssertEqual(result.exitCode, 1)
        XCTAssertEqual(result.stderr, "tokenrelay: login: the code expired; run login again\n")
        XCTAssertGreaterThan(provider.polls.count, 1)
    }

    func testOtherErrorsNameTheCodeButNotTheDescription() throws {
        let provider = try startProvider([.error("invalid_client", status: 401, description: "bad secret \(Self.clientSecret)")])
        let result = try login(try loginConfig(provider))
        XCTAssertEqual(result.exitCode, 1)
        XCTAssertTrue(result.stderr.contains("invalid_client") && result.stderr.contains("401"), result.stderr)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, result.stderr)
        assertNoSecrets(result, ["bad secret"])
    }

    func testGrantWithoutRefreshTokenIsRefused() throws {
        let before = try Data(contentsOf: tokenFileURL)
        let provider = try startProvider([.tokens(access: "only-access", refresh: nil, expiresIn: 60)])
        let result = try login(try loginConfig(provider))
        XCTAssertEqual(result.exitCode, 1)
        XCTAssertTrue(result.stderr.contains("no refresh token"), result.stderr)
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), before)
    }

    /// The new file ends "login required" in a running tokenrelay through its file watch, no restart.
    func testRunningRelayPicksUpTheLoginTokens() throws {
        let relay = try startRelay()
        try latchLoginRequired(relay)

        tokenServer.failureMode = .normal
        let fresh = tokenServer.issueInitialTokens()
        let provider = try startProvider([.pending, .tokens(access: fresh.access, refresh: fresh.refresh, expiresIn: 3600)])
        let config = try loginConfig(provider, refresh: ["token_url": tokenServer.tokenURL], login: ["token_url": provider.tokenURL])
        let result = try login(config)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("a running tokenrelay picks them up"), result.stdout)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 200 })
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testLoginKeysAreCheckedByCheck() throws {
        let provider = try startProvider([.pending])
        let cases: [([String: Any], [String: Any], String)] = [
            ([:], ["devce_authorization_url": "x"], "login.devce_authorization_url: unknown key"),
            ([:], ["device_authorization_url": NSNull()], "login.device_authorization_url: is required"),
            ([:], ["device_authorization_url": "ftp://idp/device"], "login.device_authorization_url: must be an http:// or https:// URL"),
            (["grant": "client_credentials"], [:], "login: is only used with refresh.grant refresh_token"),
        ]
        for (refresh, login, expected) in cases {
            // A null is read as absent, as everywhere in the config.
            let configURL = try loginConfig(provider, refresh: refresh, login: login)
            let result = try TokenRelayProcess.runCommand(arguments: ["check", "--config", configURL.path],
                                                          environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
            XCTAssertEqual(result.exitCode, 2, expected)
            XCTAssertTrue(result.stderr.contains(expected), "expected \(expected) in \(result.stderr)")
        }
    }

    func testLoginWithoutALoginSectionIsAConfigError() throws {
        let url = workDir.appendingPathComponent("no-login.json")
        try JSONSerialization.data(withJSONObject: config()).write(to: url)
        let result = try TokenRelayProcess.runCommand(arguments: ["login", "--config", url.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 2)
        XCTAssertTrue(result.stderr.contains("login: is required by tokenrelay login"), result.stderr)
    }
}
