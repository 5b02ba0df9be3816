import Foundation
import TLSFixtures
import XCTest

/// HTTPS to the upstream and to the token endpoint, against a Python `ssl` server and a PKI generated
/// for the test run: verification, SNI, name checks, mutual TLS, and failure reasons that say what
/// went wrong instead of a bare EOF.
final class TLSTests: RelayTestCase {
    private var pki: TestPKI!
    private var servers: [TLSTestServer] = []

    override func setUpWithError() throws {
        try super.setUpWithError()
        pki = try TestPKI.shared()
        // The TLS server plays API and token endpoint, with its own tokens.
        try writeTokenFile(at: tokenFileURL, access: TLSTestServer.initialAccessToken, refresh: TLSTestServer.initialRefreshToken)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()  // relays first: they hold connections to the servers
        servers.forEach { $0.stop() }
        servers = []
    }

    private func startServer(_ identity: TestPKI.Identity, clientCA: URL? = nil, tls12Only: Bool = false) throws -> TLSTestServer {
        let server = try TLSTestServer(role: .api, identity: identity, clientCA: clientCA, tls12Only: tls12Only, workDir: workDir)
        servers.append(server)
        return server
    }

    private func startRelay(upstream url: String, tls: [String: Any]?, refresh: [String: Any] = [:]) throws -> TokenRelayProcess {
        var upstream: [String: Any] = ["url": url]
        if let tls { upstream["tls"] = tls }
        return try startRelay(["upstream": upstream, "refresh": refresh])
    }

    private func echo(_ response: TestHTTPResponse, file: StaticString = #filePath, line: UInt = #line) throws -> [String: Any] {
        try XCTUnwrap(JSONSerialization.jsonObject(with: response.body) as? [String: Any], response.bodyText, file: file, line: line)
    }

    private func upstreamFailureLines(_ relay: TokenRelayProcess) -> [Substring] {
        relay.stderrText.split(separator: "\n").filter { $0.contains("upstream request failed") }
    }

    /// One request, answered 502, with exactly one log line whose reason contains `cause`.
    private func assertRefused(_ relay: TokenRelayProcess, cause: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let response = try get(relay)
        XCTAssertEqual(response.status, 502, response.bodyText, file: file, line: line)
        XCTAssertTrue(response.bodyText.contains(cause), response.bodyText, file: file, line: line)
        XCTAssertTrue(waitUntil(timeout: 5) { !self.upstreamFailureLines(relay).isEmpty }, file: file, line: line)
        let lines = upstreamFailureLines(relay)
        XCTAssertEqual(lines.count, 1, relay.stderrText, file: file, line: line)
        XCTAssertTrue(lines.first?.contains("TLS failure") ?? false, relay.stderrText, file: file, line: line)
        XCTAssertTrue(lines.first?.contains(cause) ?? false, "expected \(cause) in: \(relay.stderrText)", file: file, line: line)
    }

    // MARK: - Verification

    func testVerifiedUpstreamGetsTokenAndSNIAlsoAfterAReconnect() throws {
        let server = try startServer(pki.server)
        let relay = try startRelay(upstream: server.url(), tls: ["ca_file": pki.caFile.path])
        // "close" makes the server close the connection, so the next request reconnects on the same
        // evhttp connection (a fresh handshake on the same SSL object).
        for path in ["/first/close", "/second"] {
            let response = try get(relay, path)
            XCTAssertEqual(response.status, 200, response.bodyText)
            let seen = try echo(response)
            XCTAssertEqual(seen["path"] as? String, path)
            XCTAssertEqual(seen["authorization_present"] as? Bool, true)
            XCTAssertEqual(seen["token_current"] as? Bool, true)
            XCTAssertEqual(seen["sni"] as? String, "localhost")
        }
    }

    func testIPAddressURLIsCheckedAgainstTheIPSANWithoutSNI() throws {
        let server = try startServer(pki.server)
        let relay = try startRelay(upstream: server.url(host: "127.0.0.1"), tls: ["ca_file": pki.caFile.path])
        let response = try get(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertTrue(try echo(response)["sni"] is NSNull, "no SNI for an IP address")
    }

    func testUnknownCAIsRefusedWithTheReason() throws {
        let server = try startServer(pki.server)
        // No tls object: the system CA store, which does not know the test CA.
        let relay = try startRelay(upstream: server.url(), tls: nil)
        try assertRefused(relay, cause: "unable to get local issuer certificate")
    }

    func testWrongHostIsRefusedWithTheReason() throws {
        let server = try startServer(pki.wrongHost)
        let relay = try startRelay(upstream: server.url(), tls: ["ca_file": pki.caFile.path])
        try assertRefused(relay, cause: "hostname mismatch")
    }

    func testExpiredCertificateIsRefusedWithTheReason() throws {
        let server = try startServer(pki.expired)
        let relay = try startRelay(upstream: server.url(), tls: ["ca_file": pki.caFile.path])
        try assertRefused(relay, cause: "certificate has expired")
    }

    func testServerNameOverridesSNIAndTheCheckedName() throws {
        let server = try startServer(pki.wrongHost)
        let relay = try startRelay(upstream: server.url(host: "127.0.0.1"),
                                   tls: ["ca_file": pki.caFile.path, "server_name": "wrong.example.com"])
        let response = try get(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(try echo(response)["sni"] as? String, "wrong.example.com")
    }

    func testInsecureSkipVerifyConnectsAndWarns() throws {
        let server = try startServer(pki.wrongHost)
        let relay = try startRelay(upstream: server.url(), tls: ["insecure_skip_verify": true])
        XCTAssertEqual(try get(relay).status, 200)
        let warning = relay.stderrText.split(separator: "\n").first { $0.contains("level=warning") && $0.contains("verification is disabled") }
        XCTAssertNotNil(warning, relay.stderrText)
        XCTAssertTrue(warning?.contains("upstream.tls.insecure_skip_verify") ?? false, relay.stderrText)
    }

    // MARK: - Mutual TLS

    func testClientCertificateIsPresented() throws {
        let server = try startServer(pki.server, clientCA: pki.caFile)
        let relay = try startRelay(upstream: server.url(), tls: ["ca_file": pki.caFile.path, "client_cert": pki.client.cert.path,
                                                                 "client_key": pki.client.key.path])
        let response = try get(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(try echo(response)["client_cn"] as? String, TestPKI.clientCommonName)
    }

    func testMissingClientCertificateIsA502WithTheReason() throws {
        // Under TLS 1.2 the refusal is a handshake failure, always read. (Under TLS 1.3 the server's alert
        // follows the finished handshake; tokenrelay reports it when it gets to read it, which a server
        // that closes at once can prevent, so that variant cannot be asserted every time.)
        let server = try startServer(pki.server, clientCA: pki.caFile, tls12Only: true)
        let relay = try startRelay(upstream: server.url(), tls: ["ca_file": pki.caFile.path])
        try assertRefused(relay, cause: "alert")
    }

    // MARK: - Token endpoint

    func testRefreshOverTLS() throws {
        let server = try startServer(pki.server)
        let tls = ["ca_file": pki.caFile.path]
        let relay = try startRelay(upstream: server.url(), tls: tls,
                                   refresh: ["token_url": server.url(path: "/oauth/token"), "tls": tls])
        XCTAssertEqual(try get(relay).status, 200)
        // The server forgets the current access token; the next request gets 401, and tokenrelay
        // refreshes over TLS and replays.
        XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/test/expire").status, 200)
        let response = try get(relay, "/after-refresh")
        XCTAssertEqual(response.status, 200, response.bodyText + relay.stderrText)
        XCTAssertEqual(try readTokenFile()["refresh_token"] as? String, "tls-refresh-1")
        XCTAssertTrue(relay.stderrText.contains("refresh succeeded"), relay.stderrText)
    }

    func testTokenEndpointTLSFailureIsATransientFailureNamingTheCause() throws {
        let server = try startServer(pki.wrongHost)
        let relay = try startRelay(["refresh": ["token_url": server.url(path: "/oauth/token"), "max_attempts": 1,
                                                "tls": ["ca_file": pki.caFile.path]]])
        let response = try admin(relay, "/refresh", method: "POST")
        XCTAssertEqual(response.status, 503, response.bodyText)
        XCTAssertTrue(response.bodyText.contains("hostname mismatch"), response.bodyText)
        let line = relay.stderrText.split(separator: "\n").first { $0.contains("refresh failed") }
        XCTAssertTrue(line?.contains("hostname mismatch") ?? false, relay.stderrText)
        XCTAssertFalse(line?.contains("outcome=unknown") ?? true, "a refused certificate means nothing was sent")
        XCTAssertEqual(try admin(relay, "/readyz").status, 200, "a TLS failure is not a login problem")
    }

    // MARK: - login

    private func login(device: String, token: String) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("login-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config([
            "refresh": ["token_url": token, "tls": ["ca_file": pki.caFile.path]],
            "login": ["device_authorization_url": device],
        ])).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["login", "--config", url.path, "--poll-interval-scale", "0.01"],
                                                environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret], timeout: 20)
    }

    /// The device endpoint on the token endpoint's server is trusted through `refresh.tls`.
    func testLoginOverTLSUsesTheTokenEndpointsTrust() throws {
        let server = try startServer(pki.server)
        let result = try login(device: server.url(path: "/device/code"), token: server.url(path: "/oauth/token"))
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("TLS-CODE"), result.stdout)
        let written = try readTokenFile()
        XCTAssertEqual(written["access_token"] as? String, "tls-login-access")
        XCTAssertEqual(written["refresh_token"] as? String, "tls-login-refresh")
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
    }

    /// A certificate for another name fails the login with the reason, and the token file is untouched.
    func testLoginRefusesAWrongHostCertificate() throws {
        let server = try startServer(pki.wrongHost)
        let before = try Data(contentsOf: tokenFileURL)
        let result = try login(device: server.url(path: "/device/code"), token: server.url(path: "/oauth/token"))
        XCTAssertNotEqual(result.exitCode, 0)
        XCTAssertTrue(result.stderr.contains("hostname mismatch"), result.stderr)
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), before)
    }

    // MARK: - check

    private func check(_ overrides: [String: Any]) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        let url = workDir.appendingPathComponent("check-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config(overrides)).write(to: url)
        return try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path],
                                                environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
    }

    func testCheckRejectsUnloadableTLSFiles() throws {
        let missing = try check(["upstream": ["url": "https://localhost:8443", "tls": ["ca_file": workDir.appendingPathComponent("nope.pem").path]]])
        XCTAssertEqual(missing.exitCode, 2)
        XCTAssertTrue(missing.stderr.contains("upstream.tls.ca_file: cannot read"), missing.stderr)
        XCTAssertTrue(missing.stderr.contains("No such file"), missing.stderr)

        let notPEM = try check(["upstream": ["url": "https://localhost:8443", "tls": ["ca_file": tokenFileURL.path]]])
        XCTAssertEqual(notPEM.exitCode, 2)
        XCTAssertTrue(notPEM.stderr.contains("upstream.tls.ca_file: cannot load"), notPEM.stderr)

        let mismatch = try check(["refresh": ["token_url": "https://localhost:8443/token",
                                              "tls": ["client_cert": pki.client.cert.path, "client_key": pki.strayKey.path]]])
        XCTAssertEqual(mismatch.exitCode, 2)
        XCTAssertTrue(mismatch.stderr.contains("refresh.tls.client_key"), mismatch.stderr)
        XCTAssertEqual(mismatch.stderr.split(separator: "\n").count, 1, mismatch.stderr)

        let good = try check(["upstream": ["url": "https://localhost:8443", "tls": ["ca_file": pki.caFile.path, "insecure_skip_verify": true]]])
        XCTAssertEqual(good.exitCode, 0, good.stderr)
        XCTAssertTrue(good.stdout.contains("upstream.tls.insecure_skip_verify"), good.stdout)
    }
}
