import Foundation
import XCTest

/// `refresh.client_auth: private_key_jwt` against a token endpoint that verifies each client assertion's
/// signature against the registered public key, its claims (iss = sub = client_id, aud, iat, exp at most
/// 5 minutes on) and refuses a `jti` it has seen.
final class PrivateKeyJWTTests: CredentialTestCase {
    /// Every key type with its default algorithm, and RSA with PS256: two token requests each (at start,
    /// and after the access token dies), both accepted, with two different jtis.
    func testEveryKeyTypeSignsAssertionsTheEndpointAccepts() throws {
        let cases: [(TestKeys.Kind, String?)] = [(.rsa2048, nil), (.rsa2048, "PS256"), (.p256, nil), (.p384, nil), (.ed25519, nil)]
        for (kind, alg) in cases {
            let key = try TestKeys.make(kind, in: workDir)
            let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": key.path, "audience": "https://idp.test/token"])
            defer { endpoint.stop() }
            var refresh: [String: Any] = ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": key.path,
                                          "client_key_id": "key-1", "client_assertion_audience": "https://idp.test/token"]
            if let alg { refresh["client_assertion_alg"] = alg }
            let relay = try startRelay(refresh: refresh)
            let label = "\(kind) \(alg ?? "default")"
            XCTAssertEqual(try get(relay).status, 200, label)
            try endpoint.expireAccessTokens()
            XCTAssertEqual(try get(relay).status, 200, label)

            XCTAssertEqual(endpoint.strings("refusals"), [], label)
            XCTAssertEqual(endpoint.granted, 2, label)
            let assertions = endpoint.strings("client_assertions")
            XCTAssertEqual(assertions.count, 2, label)
            let claims = try assertions.map(unverifiedClaims)
            XCTAssertNotEqual(claims[0]["jti"] as? String, claims[1]["jti"] as? String, label)
            let header = try unverifiedHeader(assertions[0])
            XCTAssertEqual(header["kid"] as? String, "key-1", label)
            XCTAssertEqual(header["alg"] as? String, alg ?? ["rsa2048": "RS256", "p256": "ES256", "p384": "ES384", "ed25519": "EdDSA"][kind.rawValue], label)
            let form = try XCTUnwrap(endpoint.forms.first, label)
            XCTAssertEqual(form["client_id"], Self.clientID, label)
            XCTAssertNil(form["client_secret"], label)
            try assertNothingLeaks(relay, assertions + pemBodyLines(key))
            relay.stop()
            api.stop()
            endpoint.stop()
        }
    }

    /// The endpoint of these tests does refuse a replayed assertion (so the test above can fail), and the
    /// assertion's audience defaults to token_url, exactly as configured.
    func testDefaultAudienceAndTheEndpointRefusesAReplay() throws {
        let key = try TestKeys.make(.ed25519, in: workDir)
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": key.path])
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": key.path])
        XCTAssertEqual(try get(relay).status, 200)
        let assertion = try XCTUnwrap(endpoint.strings("client_assertions").first)
        let claims = try unverifiedClaims(assertion)
        XCTAssertEqual(claims["aud"] as? String, endpoint.tokenURL)
        XCTAssertEqual(claims["iss"] as? String, Self.clientID)
        XCTAssertEqual(claims["sub"] as? String, Self.clientID)
        let iat = try XCTUnwrap(claims["iat"] as? Int), exp = try XCTUnwrap(claims["exp"] as? Int)
        XCTAssertTrue(exp > iat && exp - iat <= 300, "\(iat) \(exp)")

        let form = try XCTUnwrap(endpoint.forms.first)
        let replay = try HTTPTestClient.send(port: endpoint.tokenPort, method: "POST", path: "/token",
                                             headers: [("Content-Type", "application/x-www-form-urlencoded")],
                                             body: Data(formEncode(form).utf8))
        XCTAssertEqual(replay.status, 401)
        XCTAssertEqual(endpoint.strings("refusals").last, "client assertion jti reused (replay)")
    }

    /// `tokenrelay login` and the refresh_token grant authenticate with the key too: a fresh assertion for
    /// the device authorization request, for every poll and for every refresh.
    func testDeviceLoginAndRefreshTokenGrant() throws {
        let key = try TestKeys.make(.p384, in: workDir)
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": key.path])
        let refresh: [String: Any] = ["grant": "refresh_token", "client_auth": "private_key_jwt", "client_key_file": key.path,
                                      "scope": "offline_access"]
        var config = relayConfig(refresh: refresh)
        config["login"] = ["device_authorization_url": "http://127.0.0.1:\(endpoint.tokenPort)/device"]
        let configURL = workDir.appendingPathComponent("login.json")
        try JSONSerialization.data(withJSONObject: config).write(to: configURL)
        let login = try TokenRelayProcess.runCommand(arguments: ["login", "--config", configURL.path, "--poll-interval-scale", "0.01"], timeout: 20)
        XCTAssertEqual(login.exitCode, 0, login.stderr)
        XCTAssertEqual(endpoint.strings("refusals"), [])

        let relay = try startRelay(refresh: refresh)
        XCTAssertEqual(try get(relay).status, 200)
        try endpoint.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.strings("refusals"), [])
        XCTAssertEqual(endpoint.forms.map { $0["grant_type"] ?? "device authorization" },
                       ["urn:ietf:params:oauth:grant-type:device_code", "refresh_token"])
        let assertions = endpoint.strings("client_assertions")
        XCTAssertEqual(assertions.count, 3, "device authorization, one poll, one refresh")
        XCTAssertEqual(Set(assertions).count, 3)
        for text in [login.stdout, login.stderr] {
            for assertion in assertions { XCTAssertFalse(text.contains(assertion.prefix(40))) }
        }
    }

    /// With DPoP, a token endpoint's `use_dpop_nonce` challenge is answered with a new request: a new client
    /// assertion (new jti), not the first one again, which an endpoint that remembers jtis refuses as a replay.
    func testDPoPNonceResendCarriesAFreshAssertion() throws {
        let key = try TestKeys.make(.p256, in: workDir)
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": key.path, "dpop_nonce": "nonce-1"])
        var config = relayConfig(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": key.path])
        config["dpop"] = ["alg": "ES256"]
        let directory = workDir.appendingPathComponent("dpop-relay")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let relay = try TokenRelayProcess.start(config: config, workDir: directory)
        defer { relay.stop() }
        XCTAssertTrue(waitUntil(timeout: 10) { endpoint.granted == 1 }, relay.stderrText)
        XCTAssertEqual(try endpoint.stats()["nonce_challenges"] as? Int, 1)
        XCTAssertEqual(endpoint.strings("refusals"), [], "the resend was not a replay")
        let assertions = endpoint.strings("client_assertions")
        XCTAssertEqual(assertions.count, 2)
        XCTAssertEqual(Set(assertions).count, 2)
    }

    /// A key file replaced in place is taken up by a reload (SIGHUP), read off the loop: the next assertion
    /// is signed with the new key. A reload with an unusable key keeps the running one.
    func testReloadTakesUpARotatedKey() throws {
        let old = try TestKeys.make(.p256, in: workDir), new = try TestKeys.make(.ed25519, in: workDir)
        let keyFile = workDir.appendingPathComponent("client_key.pem")
        try FileManager.default.copyItem(at: old, to: keyFile)
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": [old.path, new.path]])
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": keyFile.path])
        XCTAssertEqual(try get(relay).status, 200)

        try replaceFile(keyFile, with: "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("config reload failed") }, "an unusable key fails the reload")
        XCTAssertTrue(relay.stderrText.contains("refresh.client_key_file"))
        try endpoint.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200, "the running key stays in use")

        try replaceFile(keyFile, with: try String(contentsOf: new, encoding: .utf8))
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("msg=\"config reloaded\"") })
        try endpoint.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        let used = try XCTUnwrap(endpoint.stats()["client_keys_used"] as? [Int])
        XCTAssertEqual(used, [0, 0, 1], "old key, old key after the failed reload, new key after the good one")
        XCTAssertEqual(endpoint.strings("refusals"), [])
        try assertNothingLeaks(relay, try pemBodyLines(old) + pemBodyLines(new))
    }

    /// A key the endpoint refuses (invalid_client): one token request, no storm; the session waits for a
    /// new credential, and a reload that brings a new key asks again at once.
    func testRefusedKeyIsTriedAgainWhenAReloadBringsANewOne() throws {
        let unregistered = try TestKeys.make(.p256, in: workDir), registered = try TestKeys.make(.p256, in: workDir)
        let keyFile = workDir.appendingPathComponent("client_key.pem")
        try FileManager.default.copyItem(at: unregistered, to: keyFile)
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": registered.path])
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": keyFile.path])
        XCTAssertNotEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 503 })
        for _ in 0..<5 { XCTAssertNotEqual(try get(relay).status, 200) }
        XCTAssertEqual(endpoint.requests, 1, "a refused client is not asked again and again")
        XCTAssertEqual(endpoint.strings("refusals"), ["signature does not verify"])

        try replaceFile(keyFile, with: try String(contentsOf: registered, encoding: .utf8))
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, "the new key is tried at once")
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.requests, 2)
        XCTAssertTrue(relay.stderrText.contains("client credential changed; asking the token endpoint again"))
    }

    /// The same for a named identity: a reload that gives it another key asks again at once.
    func testNamedIdentityRefusedKeyIsTriedAgainAfterAReload() throws {
        let unregistered = try TestKeys.make(.ed25519, in: workDir), registered = try TestKeys.make(.ed25519, in: workDir)
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": registered.path])
        func config(key: URL) -> [String: Any] {
            var config = relayConfig(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": registered.path])
            config["identities"] = ["svc": ["tokens": ["file": workDir.appendingPathComponent("svc-tokens.json").path],
                                            "refresh": ["grant": "client_credentials", "token_url": endpoint.tokenURL, "client_id": Self.clientID,
                                                        "client_auth": "private_key_jwt", "client_key_file": key.path, "backoff_seconds": 0.05]]]
            return config
        }
        let directory = workDir.appendingPathComponent("identity-relay")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let relay = try TokenRelayProcess.start(config: config(key: unregistered), workDir: directory)
        defer { relay.stop() }
        XCTAssertTrue(waitUntil(timeout: 5) { endpoint.strings("refusals") == ["signature does not verify"] })
        XCTAssertEqual(try admin(relay, "/readyz/svc").status, 503)

        try JSONSerialization.data(withJSONObject: config(key: registered)).write(to: relay.configURL, options: .atomic)
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz/svc").status) == 200 }, relay.stderrText)
        XCTAssertEqual(endpoint.strings("refusals").count, 1)
    }

    /// A stale or foreign assertion in the file (refused: invalid_client) is tried again as soon as the
    /// file is replaced — the kubelet's next projected token — without a signal.
    func testRefusedAssertionFileIsTriedAgainWhenReplaced() throws {
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "federated_subject": "system:serviceaccount:apps:relay",
                                          "federated_audience": "api://AzureADTokenExchange"])
        let file = workDir.appendingPathComponent("token")
        try replaceFile(file, with: try endpoint.mint(subject: "system:serviceaccount:apps:other", audience: "api://AzureADTokenExchange"))
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_assertion_file": file.path])
        XCTAssertNotEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 503 })
        XCTAssertEqual(endpoint.requests, 1)

        try replaceFile(file, with: try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "api://AzureADTokenExchange"))
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, "the replaced file is tried at once")
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.requests, 2)
    }

    /// With client_key_certificate_file the header names the certificate by its SHA-256 thumbprint
    /// (`x5t#S256`), as Microsoft Entra ID's certificate credentials want; PS256 as Entra recommends.
    func testCertificateThumbprintInTheHeader() throws {
        let key = try TestKeys.make(.rsa2048, in: workDir)
        let cert = workDir.appendingPathComponent("client.crt"), der = workDir.appendingPathComponent("client.der")
        for arguments in [["req", "-new", "-x509", "-key", key.path, "-subj", "/CN=relay-client", "-days", "2", "-out", cert.path],
                          ["x509", "-in", cert.path, "-outform", "DER", "-out", der.path]] {
            let result = try runTool("openssl", arguments)
            XCTAssertEqual(result.exitCode, 0, result.stderr)
        }
        let digest = workDir.appendingPathComponent("client.sha256")
        XCTAssertEqual(try runTool("openssl", ["dgst", "-sha256", "-binary", "-out", digest.path, der.path]).exitCode, 0)
        let expected = try Data(contentsOf: digest).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "client_key": key.path])
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt", "client_key_file": key.path,
                                             "client_key_certificate_file": cert.path, "client_assertion_alg": "PS256"])
        XCTAssertEqual(try get(relay).status, 200)
        let header = try unverifiedHeader(try XCTUnwrap(endpoint.strings("client_assertions").first))
        XCTAssertEqual(header["x5t#S256"] as? String, expected)
        XCTAssertEqual(header["alg"] as? String, "PS256")
    }

    /// A ready-made assertion (a projected service-account token) is read for every token request: the
    /// file replaced between two refreshes, the endpoint sees the new one.
    func testAssertionFileReplacedBetweenRefreshes() throws {
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "federated_subject": "system:serviceaccount:apps:relay",
                                          "federated_audience": "api://AzureADTokenExchange"])
        let file = workDir.appendingPathComponent("azure-identity-token")
        let first = try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "api://AzureADTokenExchange")
        try replaceFile(file, with: first + "\n")
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt",
                                             "client_assertion_file": file.path])
        XCTAssertEqual(try get(relay).status, 200)
        let second = try endpoint.mint(subject: "system:serviceaccount:apps:relay", audience: "api://AzureADTokenExchange")
        try replaceFile(file, with: second)
        try endpoint.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(endpoint.strings("client_assertions"), [first, second])
        XCTAssertEqual(endpoint.strings("refusals"), [])
        try assertNothingLeaks(relay, [first, second])
    }

    /// Missing, empty, not a JWT, expired: a transient failure with a one-line reason naming the file, no
    /// request with an empty or stale assertion, no crash; a good file afterwards works without a restart.
    func testUnusableAssertionFileIsATransientFailure() throws {
        let endpoint = try startEndpoint(["client_auth": "private_key_jwt", "federated_subject": "sa", "federated_audience": "aud"])
        let file = workDir.appendingPathComponent("token")
        let relay = try startRelay(refresh: ["grant": "client_credentials", "client_auth": "private_key_jwt",
                                             "client_assertion_file": file.path, "max_attempts": 1])
        let expired = try endpoint.mint(subject: "sa", audience: "aud", lifetime: -60)
        let cases: [(String?, String)] = [(nil, "cannot read \(file.path)"), ("", "\(file.path) is empty"),
                                          ("not-a-jwt", "\(file.path) does not hold a JWT"), (expired, "expired at")]
        for (content, reason) in cases {
            if let content { try replaceFile(file, with: content) }
            XCTAssertNotEqual(try get(relay).status, 200, reason)
            XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains(reason) }, "log names the cause: \(reason)")
            XCTAssertTrue(relay.isRunning)
        }
        XCTAssertEqual(endpoint.requests, 0, "no token request without a usable assertion")
        XCTAssertFalse(relay.stderrText.contains("login required"), "a missing assertion is not a dead session")
        try replaceFile(file, with: try endpoint.mint(subject: "sa", audience: "aud"))
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.get(relay).status) == 200 })
        try assertNothingLeaks(relay, [expired])
    }

    // MARK: - reading what was sent

    private func parts(_ jwt: String) throws -> [Substring] {
        let parts = jwt.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw TestSupportError("not a JWS") }
        return parts
    }

    private func decode(_ part: Substring) throws -> [String: Any] {
        var text = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        guard let data = Data(base64Encoded: text), let object = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw TestSupportError("not base64url JSON")
        }
        return object
    }

    func unverifiedClaims(_ jwt: String) throws -> [String: Any] { try decode(parts(jwt)[1]) }
    func unverifiedHeader(_ jwt: String) throws -> [String: Any] { try decode(parts(jwt)[0]) }

    private func formEncode(_ form: [String: String]) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return form.map { "\($0.key.addingPercentEncoding(withAllowedCharacters: allowed)!)=\($0.value.addingPercentEncoding(withAllowedCharacters: allowed)!)" }
            .joined(separator: "&")
    }
}
