import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// `tokens.encryption`: the token file sealed at rest (AES-256-GCM) with a key from a file or the
/// environment, against the real binary and the rotating fake token server.
final class SealedTokenFileTests: RelayTestCase, SealedStateChecks {
    private var key: (url: URL, bytes: Data)!

    override func setUpWithError() throws {
        try super.setUpWithError()
        key = try writeKey(workDir, "token-key")
    }

    private func sealing(_ keyFile: URL? = nil, previous: [URL] = []) -> [String: Any] {
        var encryption: [String: Any] = ["key_file": (keyFile ?? key.url).path]
        if !previous.isEmpty { encryption["previous_key_files"] = previous.map(\.path) }
        return ["tokens": ["encryption": encryption]]
    }

    private func writeConfig(_ overrides: [String: Any]) throws -> URL {
        let url = workDir.appendingPathComponent("config-\(UUID().uuidString).json")
        try JSONSerialization.data(withJSONObject: config(overrides)).write(to: url)
        return url
    }

    private func command(_ arguments: [String], stdin: Data? = nil) throws -> (exitCode: Int32, stdout: String, stderr: String) {
        try TokenRelayProcess.runCommand(arguments: arguments, environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret], stdin: stdin)
    }

    private var currentTokens: [String] { [tokenServer.currentAccessToken, tokenServer.currentRefreshToken].compactMap { $0 } }

    func testAPlaintextFileIsSealedAtStartServedAndSealedAgainAfterARefreshAndARestart() throws {
        let before = currentTokens
        let relay = try startRelay(sealing())
        let stored = try Data(contentsOf: tokenFileURL)
        let envelope = try sealedEnvelope(stored)
        XCTAssertEqual(envelope["key_id"] as? String, try keyID(key.bytes))
        assertHoldsNone(of: before, in: stored, "the token file sealed at start")
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
        XCTAssertTrue(relay.stderrText.contains("token file sealed with tokens.encryption.key_file"), relay.stderrText)
        XCTAssertEqual(try get(relay).status, 200)

        // A refresh (the token expired upstream) writes the rotated tokens sealed, under a fresh nonce.
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/after-expiry").status, 200)
        XCTAssertTrue(waitUntil(timeout: 10) { (try? Data(contentsOf: self.tokenFileURL)) != stored }, "the refresh was written")
        let rotated = try Data(contentsOf: tokenFileURL)
        XCTAssertNotEqual(try sealedEnvelope(rotated)["nonce"] as? String, envelope["nonce"] as? String)
        assertHoldsNone(of: currentTokens + before, in: rotated, "the token file after a refresh")
        let opened = try openIndependently(rotated, key: key.bytes, associatedData: "tokenrelay token state v1: token file")
        XCTAssertEqual(opened["refresh_token"] as? String, tokenServer.currentRefreshToken)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        relay.stop()

        // A restart reads the sealed file: no login, no refresh, the same tokens served.
        let again = try startRelay(sealing())
        XCTAssertEqual(try get(again, "/after-restart").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "the sealed file's tokens were used as they are")
        XCTAssertFalse(again.stderrText.contains("token file sealed with"), "already sealed with the current key: not rewritten")
        try assertNothingSecretReachedTheOutside(again, extra: [String(data: rotated, encoding: .utf8)!])
    }

    /// Neither the key (in any spelling) nor a sealed byte reaches a log line, /status, /metrics or an
    /// error body.
    private func assertNothingSecretReachedTheOutside(_ relay: TokenRelayProcess, extra: [String]) throws {
        let status = try admin(relay, "/status").bodyText
        let metrics = try admin(relay, "/metrics").bodyText
        // Bodies tokenrelay itself writes: a forced refresh (the store read and written again), readiness, a 404.
        let refreshed = try admin(relay, "/refresh", method: "POST").bodyText
        let bodies = [refreshed, try admin(relay, "/readyz").bodyText, try admin(relay, "/no-such-page").bodyText]
        let outside = ([relay.stderrText, relay.stdoutText, status, metrics] + bodies).joined(separator: "\n")
        // Every sealed state seen: the ones given, and the file as it is now (after the forced refresh).
        let states = extra + [(try? String(contentsOf: tokenFileURL, encoding: .utf8)) ?? ""]
        let sealedParts = states.flatMap { text -> [String] in
            guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
                  let sealed = object["sealed"] as? [String: Any] else { return [] }
            return [(sealed["ciphertext"] as? String).map { String($0.prefix(24)) }, sealed["nonce"] as? String].compactMap { $0 }
        }
        XCTAssertGreaterThanOrEqual(sealedParts.count, 4)
        for secret in spellings(of: key.bytes) + sealedParts {
            XCTAssertFalse(outside.contains(secret), "a key or sealed byte reached the outside (\(secret.prefix(6))…)")
        }
    }

    func testARotatedKeyReadsTheOldFileAndRewritesItWithTheNewKey() throws {
        _ = try startRelay(sealing()).stop()
        let old = try sealedEnvelope(try Data(contentsOf: tokenFileURL))
        XCTAssertEqual(old["key_id"] as? String, try keyID(key.bytes))

        let next = try writeKey(workDir, "token-key-2", raw: true)
        let check = try command(["check", "--config", try writeConfig(sealing(next.url, previous: [key.url])).path])
        XCTAssertEqual(check.exitCode, 0, check.stderr)
        let relay = try startRelay(sealing(next.url, previous: [key.url]))
        let rotated = try sealedEnvelope(try Data(contentsOf: tokenFileURL))
        XCTAssertEqual(rotated["key_id"] as? String, try keyID(next.bytes), "rewritten with key_file")
        XCTAssertTrue(relay.stderrText.contains("sealed with the previous key \(try keyID(key.bytes))"), relay.stderrText)
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 0, "rotation needs no login and no refresh")
    }

    func testAFileSealedWithAnUnknownKeyStopsCheckAndRunAndIsLeftByteIdentical() throws {
        _ = try startRelay(sealing()).stop()
        let sealed = try Data(contentsOf: tokenFileURL)
        let other = try writeKey(workDir, "unrelated-key")
        let configURL = try writeConfig(sealing(other.url))

        let check = try command(["check", "--config", configURL.path])
        assertOneLineFailure(check, mentioning: "tokens.encryption.key_file")
        XCTAssertTrue(check.stderr.contains(try keyID(key.bytes)), "names the key id the file needs: \(check.stderr)")
        let run = try command(["run", "--config", configURL.path])
        assertOneLineFailure(run, mentioning: "tokens.encryption.key_file")
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), sealed, "never overwritten")

        // Without any key configured, a sealed file says what to configure.
        let plain = try command(["check", "--config", try writeConfig([:]).path])
        assertOneLineFailure(plain, mentioning: "tokens.encryption.key_file")
        XCTAssertEqual(try Data(contentsOf: tokenFileURL), sealed)
    }

    func testATamperedOrTruncatedFileIsRefusedWithOneLineAndNeverRepaired() throws {
        _ = try startRelay(sealing()).stop()
        let sealed = try Data(contentsOf: tokenFileURL)
        let configURL = try writeConfig(sealing())
        var object = try XCTUnwrap(JSONSerialization.jsonObject(with: sealed) as? [String: Any])
        var envelope = try XCTUnwrap(object["sealed"] as? [String: Any])
        var ciphertext = Array(try XCTUnwrap(envelope["ciphertext"] as? String))
        ciphertext[4] = ciphertext[4] == "A" ? "B" : "A"
        envelope["ciphertext"] = String(ciphertext)
        object["sealed"] = envelope
        let cases: [(String, Data)] = [
            ("one ciphertext character changed", try JSONSerialization.data(withJSONObject: object)),
            ("ciphertext cut short", try JSONSerialization.data(withJSONObject: ["sealed": envelope.merging(["ciphertext": String(ciphertext.prefix(30))]) { $1 }])),
            ("the file cut in half", sealed.prefix(sealed.count / 2)),
        ]
        for (what, bytes) in cases {
            try bytes.write(to: tokenFileURL)
            XCTAssertEqual(chmod(tokenFileURL.path, 0o600), 0)
            assertOneLineFailure(try command(["check", "--config", configURL.path]), mentioning: tokenFileURL.path, what)
            assertOneLineFailure(try command(["run", "--config", configURL.path]), mentioning: tokenFileURL.path, what)
            XCTAssertEqual(try Data(contentsOf: tokenFileURL), bytes, "\(what): left as it is")
        }
        XCTAssertEqual(tokenServer.successfulRefreshes, 0)
    }

    func testTokenImportAndShowSealWithTheConfig() throws {
        let configURL = try writeConfig(sealing())
        let access = tokenServer.currentAccessToken!, refresh = tokenServer.currentRefreshToken!
        let input = try JSONSerialization.data(withJSONObject: ["access_token": access, "refresh_token": refresh, "expires_in": 3600,
                                                                "dpop_key": "a-private-field-sealed-too"])
        let imported = try command(["token", "import", "--config", configURL.path], stdin: input)
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)
        XCTAssertTrue(imported.stdout.contains("sealed"), imported.stdout)
        let stored = try Data(contentsOf: tokenFileURL)
        _ = try sealedEnvelope(stored)
        assertHoldsNone(of: [access, refresh, "a-private-field-sealed-too"], in: stored, "the imported file")

        let shown = try command(["token", "show", "--config", configURL.path])
        XCTAssertEqual(shown.exitCode, 0, shown.stderr)
        XCTAssertTrue(shown.stdout.contains("stored: sealed, AES-256-GCM, key id \(try keyID(key.bytes))"), shown.stdout)
        XCTAssertTrue(shown.stdout.contains("refresh token: present"), shown.stdout)
        for text in [imported.stdout, imported.stderr, shown.stdout, shown.stderr] {
            XCTAssertFalse(spellings(of: key.bytes).contains { text.contains($0) })
            XCTAssertFalse(text.contains(access) || text.contains(refresh))
        }
        let relay = try startRelay(sealing())
        XCTAssertEqual(try get(relay).status, 200, "the relay reads what import sealed")
    }

    func testLoginSealsTheFileItWritesAndKeepsTheSealedFilesOtherFields() throws {
        // The old file: sealed, with a field tokenrelay does not interpret.
        let input = try JSONSerialization.data(withJSONObject: ["access_token": "old-access", "refresh_token": "old-refresh", "note": "kept"])
        XCTAssertEqual(try command(["token", "import", "--config", try writeConfig(sealing()).path], stdin: input).exitCode, 0)
        let provider = try FakeDeviceAuthorizationServer(script: [.tokens(access: "login-access-sealed", refresh: "login-refresh-sealed", expiresIn: 3600)],
                                                         interval: 0.05)
        defer { provider.stop() }
        let configURL = try writeConfig(sealing().merging([
            "refresh": ["token_url": provider.tokenURL, "scope": "offline_access"],
            "login": ["device_authorization_url": provider.deviceAuthorizationURL],
        ]) { $1 })
        let result = try TokenRelayProcess.runCommand(arguments: ["login", "--config", configURL.path, "--poll-interval-scale", "0.01"],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret], timeout: 20)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        let stored = try Data(contentsOf: tokenFileURL)
        XCTAssertEqual(try sealedEnvelope(stored)["key_id"] as? String, try keyID(key.bytes))
        assertHoldsNone(of: ["login-access-sealed", "login-refresh-sealed", "kept"], in: stored, "the file login wrote")
        let opened = try openIndependently(stored, key: key.bytes, associatedData: "tokenrelay token state v1: token file")
        XCTAssertEqual(opened["access_token"] as? String, "login-access-sealed")
        XCTAssertEqual(opened["refresh_token"] as? String, "login-refresh-sealed")
        XCTAssertEqual(opened["note"] as? String, "kept", "the old sealed file's other fields survive a login")
        XCTAssertThrowsError(try openIndependently(stored, key: key.bytes, associatedData: "tokenrelay token state v1: redis key k"))
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
        let shown = try command(["token", "show", "--config", configURL.path])
        XCTAssertTrue(shown.stdout.contains("stored: sealed"), shown.stdout)
        XCTAssertTrue(shown.stdout.contains("refresh token: present"), shown.stdout)
    }

    func testKeyEnvAndBadKeysGetOneLineNamingTheField() throws {
        // key_env: base64 in the environment.
        let url = workDir.appendingPathComponent("env-config.json")
        try JSONSerialization.data(withJSONObject: config(["tokens": ["encryption": ["key_env": "TOKENRELAY_STATE_KEY"]]])).write(to: url)
        let ok = try TokenRelayProcess.runCommand(arguments: ["check", "--config", url.path],
                                                  environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret, "TOKENRELAY_STATE_KEY": key.bytes.base64EncodedString()])
        XCTAssertEqual(ok.exitCode, 0, ok.stderr)
        assertOneLineFailure(try command(["check", "--config", url.path]), mentioning: "tokens.encryption.key_env: environment variable TOKENRELAY_STATE_KEY is not set")

        let short = workDir.appendingPathComponent("short-key")
        try Data("c2hvcnQta2V5LWNvbnRlbnQ=\n".utf8).write(to: short)
        let shortResult = try command(["check", "--config", try writeConfig(sealing(short)).path])
        assertOneLineFailure(shortResult, mentioning: "tokens.encryption.key_file: \(short.path) holds neither 32 raw bytes nor base64 of 32 bytes")
        XCTAssertFalse(shortResult.stderr.contains("c2hvcnQ"), "the key file's content is never quoted")
        assertOneLineFailure(try command(["check", "--config", try writeConfig(sealing(workDir.appendingPathComponent("absent"))).path]),
                             mentioning: "tokens.encryption.key_file: cannot read")
        assertOneLineFailure(try command(["check", "--config", try writeConfig(sealing(key.url, previous: [short])).path]),
                             mentioning: "tokens.encryption.previous_key_files[0]")
        assertOneLineFailure(try command(["check", "--config", try writeConfig(["tokens": ["encryption": [String: Any]()]]).path]),
                             mentioning: "tokens.encryption.key_file: is required")
    }

    private func assertOneLineFailure(_ result: (exitCode: Int32, stdout: String, stderr: String), mentioning text: String, _ what: String = "",
                                      file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertNotEqual(result.exitCode, 0, what, file: file, line: line)
        XCTAssertEqual(result.stderr.split(separator: "\n").count, 1, "\(what): one line: \(result.stderr)", file: file, line: line)
        XCTAssertTrue(result.stderr.contains(text), "\(what): expected \(text) in \(result.stderr)", file: file, line: line)
    }
}
