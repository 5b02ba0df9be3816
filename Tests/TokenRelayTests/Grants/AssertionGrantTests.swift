import Foundation
import XCTest

/// The two grants without a refresh token: jwt_bearer (RFC 7523 §2.1) and token_exchange (RFC 8693).
/// Both behave like client_credentials: a token at start, a new one on a refresh-triggering 401, one
/// token request for a whole burst.
final class AssertionGrantTests: CredentialTestCase {
    private let serviceAccount = "relay@project.iam.test"

    func testJWTBearerSignedAssertionAndABurstAfterExpiry() throws {
        let key = try TestKeys.make(.rsa2048, in: workDir)
        let endpoint = try startEndpoint(["client_auth": "none", "grant_key": key.path, "grant_issuer": serviceAccount,
                                          "grant_subject": serviceAccount, "grant_audience": "https://oauth2.test/token",
                                          "grant_max_lifetime": 600, "grant_claims": ["scope": "https://api.test/read"]])
        let relay = try startRelay(refresh: ["grant": "jwt_bearer", "client_id": NSNull(), "scope": "api.read",
                                             "assertion": ["key_file": key.path, "key_id": "sa-key", "issuer": serviceAccount,
                                                           "subject": serviceAccount, "audience": "https://oauth2.test/token",
                                                           "lifetime_seconds": 600, "claims": ["scope": "https://api.test/read"]]])
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.granted, 1)
        try endpoint.expireAccessTokens()

        let responses = HTTPTestClient.concurrently(20) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/items/\(i)") }
        XCTAssertEqual(responses.compactMap { try? $0.get().status }, Array(repeating: 200, count: 20))
        XCTAssertEqual(endpoint.requests, 2, "one token request for the whole burst")
        XCTAssertEqual(endpoint.strings("refusals"), [])
        let form = try XCTUnwrap(endpoint.forms.last)
        XCTAssertEqual(form["grant_type"], "urn:ietf:params:oauth:grant-type:jwt-bearer")
        XCTAssertEqual(form["scope"], "api.read")
        XCTAssertNil(form["client_id"], "no client authentication configured")
        let assertions = endpoint.strings("grant_assertions")
        XCTAssertEqual(Set(assertions).count, 2, "a fresh assertion per request")
        XCTAssertNil(try readTokenFile()["refresh_token"])
        try assertNothingLeaks(relay, assertions + pemBodyLines(key))
    }

    func testJWTBearerAssertionFromAFileReadForEachRequest() throws {
        let endpoint = try startEndpoint(["client_auth": "none", "grant_subject": "system:serviceaccount:apps:relay",
                                          "grant_audience": "https://sts.test"])
        let file = workDir.appendingPathComponent("token")
        let first = try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "https://sts.test")
        try replaceFile(file, with: first)
        let relay = try startRelay(refresh: ["grant": "jwt_bearer", "assertion": ["file": file.path]])
        XCTAssertEqual(try get(relay).status, 200)
        let second = try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "https://sts.test")
        try replaceFile(file, with: second)
        try endpoint.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.strings("grant_assertions"), [first, second])
        XCTAssertEqual(endpoint.forms.last?["client_id"], Self.clientID, "client_auth none still names a configured client")
    }

    func testTokenExchangeWithABurstAfterExpiry() throws {
        let endpoint = try startEndpoint(["client_auth": "client_secret_post", "client_secret": "exchange-secret-5f1c"])
        let subjectFile = workDir.appendingPathComponent("subject"), actorFile = workDir.appendingPathComponent("actor")
        let subject = try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "sts")
        let actor = try endpoint.mint(subject: "system:serviceaccount:mesh:gateway", audience: "sts")
        try replaceFile(subjectFile, with: subject)
        try replaceFile(actorFile, with: actor)
        let secretFile = workDir.appendingPathComponent("client_secret")
        try Data("exchange-secret-5f1c\n".utf8).write(to: secretFile)
        let relay = try startRelay(refresh: ["grant": "token_exchange", "client_auth": "client_secret_post", "client_secret_file": secretFile.path,
                                             "subject_token_file": subjectFile.path, "actor_token_file": actorFile.path,
                                             "audience": "payments", "resource": "https://payments.test/", "scope": "pay",
                                             "requested_token_type": "urn:ietf:params:oauth:token-type:access_token"])
        XCTAssertEqual(try get(relay).status, 200)
        let renewed = try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "sts")
        try replaceFile(subjectFile, with: renewed)
        try endpoint.expireAccessTokens()

        let responses = HTTPTestClient.concurrently(20) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/items/\(i)") }
        XCTAssertEqual(responses.compactMap { try? $0.get().status }, Array(repeating: 200, count: 20))
        XCTAssertEqual(endpoint.requests, 2, "one token exchange for the whole burst")
        XCTAssertEqual(endpoint.strings("refusals"), [])
        XCTAssertEqual(endpoint.strings("subject_tokens"), [subject, renewed], "the subject token file is read for every exchange")
        let form = try XCTUnwrap(endpoint.forms.last)
        XCTAssertEqual(form["grant_type"], "urn:ietf:params:oauth:grant-type:token-exchange")
        XCTAssertEqual(form["subject_token_type"], "urn:ietf:params:oauth:token-type:jwt")
        XCTAssertEqual(form["actor_token"], actor)
        XCTAssertEqual(form["actor_token_type"], "urn:ietf:params:oauth:token-type:jwt")
        XCTAssertEqual(form["audience"], "payments")
        XCTAssertEqual(form["resource"], "https://payments.test/")
        XCTAssertEqual(form["scope"], "pay")
        XCTAssertEqual(form["requested_token_type"], "urn:ietf:params:oauth:token-type:access_token")
        try assertNothingLeaks(relay, [subject, renewed, actor, "exchange-secret-5f1c"])
    }

    func testTokenExchangeWithAnExpiredSubjectTokenSendsNothing() throws {
        let endpoint = try startEndpoint(["client_auth": "none"])
        let subjectFile = workDir.appendingPathComponent("subject")
        try replaceFile(subjectFile, with: try endpoint.mint(subject: "sa", audience: "sts", lifetime: -5))
        let relay = try startRelay(refresh: ["grant": "token_exchange", "subject_token_file": subjectFile.path, "max_attempts": 1])
        XCTAssertNotEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("refresh.subject_token_file: the JWT in \(subjectFile.path) expired at") })
        XCTAssertEqual(endpoint.requests, 0)
        try replaceFile(subjectFile, with: try endpoint.mint(subject: "sa", audience: "sts"))
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.get(relay).status) == 200 })
    }

    /// A subject token the endpoint refuses (invalid_grant): one exchange; a replaced file is tried at once.
    func testRefusedSubjectTokenIsTriedAgainWhenTheFileIsReplaced() throws {
        let endpoint = try startEndpoint(["client_auth": "none"])
        let subjectFile = workDir.appendingPathComponent("subject")
        let good = try endpoint.mint(subject: "sa", audience: "sts")
        let parts = good.split(separator: ".")
        try replaceFile(subjectFile, with: "\(parts[0]).\(parts[1]).\(String(parts[2].reversed()))")  // not the kubelet's signature
        let relay = try startRelay(refresh: ["grant": "token_exchange", "subject_token_file": subjectFile.path])
        XCTAssertNotEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 503 })
        XCTAssertEqual(endpoint.requests, 1)
        try replaceFile(subjectFile, with: good)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.requests, 2)
    }

    /// The same for a named identity: its own subject-token file, watched for it alone.
    func testNamedIdentityRetriesWhenItsSubjectTokenFileIsReplaced() throws {
        let endpoint = try startEndpoint(["client_auth": "none"])
        let subjectFile = workDir.appendingPathComponent("identity-subject")
        let good = try endpoint.mint(subject: "sa", audience: "sts")
        let parts = good.split(separator: ".")
        try replaceFile(subjectFile, with: "\(parts[0]).\(parts[1]).\(String(parts[2].reversed()))")
        var config = relayConfig(refresh: ["grant": "client_credentials", "client_auth": "none"])
        config["identities"] = ["sts": ["tokens": ["file": workDir.appendingPathComponent("sts-tokens.json").path, "watch_interval_seconds": 0.2],
                                        "refresh": ["grant": "token_exchange", "token_url": endpoint.tokenURL, "backoff_seconds": 0.05,
                                                    "subject_token_file": subjectFile.path]]]
        let directory = workDir.appendingPathComponent("identity-relay")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let relay = try TokenRelayProcess.start(config: config, workDir: directory)
        defer { relay.stop() }
        XCTAssertTrue(waitUntil(timeout: 5) { endpoint.strings("refusals").count == 1 })
        XCTAssertEqual(try admin(relay, "/readyz/sts").status, 503)
        try replaceFile(subjectFile, with: good)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz/sts").status) == 200 }, relay.stderrText)
        XCTAssertEqual(endpoint.strings("subject_tokens").last, good)
    }

    private func readTokenFile() throws -> [String: Any] {
        try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: tokenFileURL)) as? [String: Any])
    }
}
