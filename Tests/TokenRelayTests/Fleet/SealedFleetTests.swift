import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Fleet mode with `tokens.encryption`: the Redis value (and the local cache) sealed, against a real
/// redis-server.
final class SealedFleetTests: FleetTestCase, SealedStateChecks {
    private var stateKey: (url: URL, bytes: Data)!

    override func setUpWithError() throws {
        try super.setUpWithError()
        stateKey = try writeKey(workDir, "fleet-state-key")
    }

    private func sealedFleetConfig(cache: Bool = false, keyFile: URL? = nil) -> [String: Any] {
        var config = fleetConfig(cache: cache)
        var tokens = config["tokens"] as! [String: Any]
        tokens["encryption"] = ["key_file": (keyFile ?? stateKey.url).path]
        config["tokens"] = tokens
        return config
    }

    private func storedValue() throws -> Data { Data(try redis.cli(["HGET", key, "tokens"]).utf8) }

    func testAPlainRedisValueIsSealedAtStartAndEveryRefreshStaysSealed() throws {
        try importTokens()  // without encryption: the value is plain JSON, as before this feature
        let before = [tokenServer.currentAccessToken!, tokenServer.currentRefreshToken!]
        XCTAssertTrue(try storedValue().count > 0 && String(decoding: try storedValue(), as: UTF8.self).contains(before[1]))

        let relays = try (0..<2).map { index in try startRelay(sealedFleetConfig(cache: index == 0)) }
        for relay in relays { XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }) }
        let resealed = try storedValue()
        XCTAssertEqual(try sealedEnvelope(resealed)["key_id"] as? String, try keyID(stateKey.bytes))
        assertHoldsNone(of: before, in: resealed, "the Redis value resealed at start")
        XCTAssertTrue(relays.contains { $0.stderrText.contains("Redis token value sealed with tokens.encryption.key_file") })

        tokenServer.expireAccessTokens()
        let responses = burst(10) { index in try HTTPTestClient.send(port: relays[index % 2].proxyPort, method: "GET", path: "/b/\(index)") }
        XCTAssertEqual(statusCounts(responses), [200: 10])
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "one refresh fleet-wide, read back through the sealed value")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        let after = [tokenServer.currentAccessToken!, tokenServer.currentRefreshToken!]
        let stored = try storedValue()
        _ = try sealedEnvelope(stored)
        assertHoldsNone(of: before + after, in: stored, "the Redis value after a refresh")
        XCTAssertEqual(try openIndependently(stored, key: stateKey.bytes, associatedData: "tokenrelay token state v1: redis key \(key)")["refresh_token"] as? String,
                       tokenServer.currentRefreshToken, "bound to the Redis key")
        // The whole hash: no other field holds a token either.
        assertHoldsNone(of: before + after, in: Data(try redis.cli(["HGETALL", key]).utf8), "the Redis hash")

        // The first relay's local cache is sealed too (bound to the Redis key it caches).
        XCTAssertTrue(waitUntil(timeout: 10) {
            guard let data = try? Data(contentsOf: self.tokenFileURL) else { return false }
            return (try? JSONSerialization.jsonObject(with: data) as? [String: Any])?["sealed"] != nil
        }, "the cache was written sealed")
        assertHoldsNone(of: before + after, in: try Data(contentsOf: tokenFileURL), "the local cache")
        XCTAssertNotNil(try openIndependently(try Data(contentsOf: tokenFileURL), key: stateKey.bytes,
                                              associatedData: "tokenrelay token state v1: local cache of redis key \(key)")["access_token"])

        // token show reads the sealed value with the config's key.
        let configURL = workDir.appendingPathComponent("show-config.json")
        try JSONSerialization.data(withJSONObject: sealedFleetConfig()).write(to: configURL)
        let shown = try TokenRelayProcess.runCommand(arguments: ["token", "show", "--config", configURL.path],
                                                     environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(shown.exitCode, 0, shown.stderr)
        XCTAssertTrue(shown.stdout.contains("stored: sealed, AES-256-GCM, key id \(try keyID(stateKey.bytes))"), shown.stdout)
        for relay in relays {
            let outside = [relay.stderrText, try admin(relay, "/status").bodyText, try admin(relay, "/metrics").bodyText].joined()
            XCTAssertFalse(spellings(of: stateKey.bytes).contains { outside.contains($0) }, "the key reached the outside")
            let ciphertext = try XCTUnwrap(try sealedEnvelope(stored)["ciphertext"] as? String)
            XCTAssertFalse(outside.contains(String(ciphertext.prefix(24))), "a sealed byte reached the outside")
        }
    }

    func testARedisValueSealedWithAnUnknownKeyStopsRunAndIsLeftAsItIs() throws {
        try importTokens()
        let relay = try startRelay(sealedFleetConfig())
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })
        relay.stop()
        let sealed = try storedValue()
        _ = try sealedEnvelope(sealed)
        let version = try storedVersion()

        let other = try writeKey(workDir, "another-key")
        let configURL = workDir.appendingPathComponent("other-key.json")
        try JSONSerialization.data(withJSONObject: sealedFleetConfig(keyFile: other.url)).write(to: configURL)
        let run = try TokenRelayProcess.runCommand(arguments: ["run", "--config", configURL.path],
                                                   environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertNotEqual(run.exitCode, 0)
        XCTAssertEqual(run.stderr.split(separator: "\n").filter { !$0.contains("level=info") && !$0.contains("level=debug") }.count, 1, run.stderr)
        XCTAssertTrue(run.stderr.contains("tokens.encryption.key_file"), run.stderr)
        XCTAssertEqual(try storedValue(), sealed, "left as it is")
        XCTAssertEqual(try storedVersion(), version)
    }
}

/// A key rotated by a reload: the key files are read again off the loop, and the next write seals with the
/// new key; a reload that drops the key is refused.
final class SealedTokenReloadTests: ReloadTestCase, SealedStateChecks {
    func testAReloadBringsTheRotatedKeyToTheNextWrite() throws {
        let old = try writeKey(workDir, "key-old"), new = try writeKey(workDir, "key-new")
        let relay = try startRelay(["tokens": ["encryption": ["key_file": old.url.path]]])
        XCTAssertEqual(try sealedEnvelope(try Data(contentsOf: tokenFileURL))["key_id"] as? String, try keyID(old.bytes))

        try reload(relay, ["tokens": ["encryption": ["key_file": new.url.path, "previous_key_files": [old.url.path]]]])
        XCTAssertTrue(relay.stderrText.contains("config reloaded"), relay.stderrText)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/after-rotation").status, 200)
        XCTAssertTrue(waitUntil(timeout: 10) {
            ((try? Data(contentsOf: self.tokenFileURL)).flatMap { try? self.sealedEnvelope($0)["key_id"] as? String }) == (try? self.keyID(new.bytes))
        }, "the refresh after the reload was sealed with the new key")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertFalse(spellings(of: new.bytes).contains { relay.stderrText.contains($0) })

        // Dropping the key by a reload is refused (the sealed file cannot be read without it): one line, and
        // the running config, key included, stays.
        try reload(relay, ["tokens": ["encryption": NSNull()]])
        XCTAssertTrue(relay.stderrText.contains("config reload failed; the running config stays")
                      && relay.stderrText.contains("tokens.encryption.key_file must name its key"), relay.stderrText)
        XCTAssertEqual(try get(relay, "/after-refused-reload").status, 200)
    }
}
