import Foundation
import XCTest

/// DPoP in fleet mode without `dpop.key_file`: the generated key is kept in the Redis record (sealed under
/// `tokens.encryption`), so relays started at once settle on ONE key, and a token one relay obtained works
/// through another. Real redis-server, the DPoP token server and API (`DPoPServer`).
final class DPoPFleetTests: XCTestCase, SealedStateChecks {
    private var workDir: URL!
    private var redis: RedisServerProcess!
    private var server: DPoPServer!
    private var relays: [TokenRelayProcess] = []
    private let key = "tokenrelay:dpop-fleet"
    private var tokenFileURL: URL { workDir.appendingPathComponent("seed-tokens.json") }

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory(prefix: "tokenrelay-dpop-fleet")
        redis = try RedisServerProcess()
        server = try DPoPServer(settings: ["refresh_token": "rt-seed", "token_nonce_every": 1, "api_nonce_every": 5], workDir: workDir)
        try writeTokenFile(at: tokenFileURL, access: "not-yet-issued", refresh: "rt-seed")
    }

    override func tearDownWithError() throws {
        relays.forEach { $0.stop() }
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0 {
            for relay in relays { print("--- relay log:\n" + relay.stderrText.split(separator: "\n").suffix(30).joined(separator: "\n")) }
            if let server { print("--- dpop server stderr:\n\(server.stderrText.suffix(3000))\nstats: \((try? server.stats()) ?? [:])") }
        }
        relays = []
        server?.stop()
        redis?.stop()
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    private func config(sealingKey: URL?) -> [String: Any] {
        var tokens: [String: Any] = ["redis": ["url": redis.url, "key": key, "command_timeout_seconds": 0.5, "poll_interval_seconds": 0.1]]
        if let sealingKey { tokens["encryption"] = ["key_file": sealingKey.path] }
        return [
            "listen": "127.0.0.1:0",
            "upstream": ["url": server.apiURL],
            "tokens": tokens,
            "refresh": ["token_url": server.tokenURL, "client_id": "relay-client", "grant": "refresh_token", "client_auth": "none",
                        "backoff_seconds": 0.05],
            "admin": ["listen": "127.0.0.1:0"],
            "log": ["level": "debug"],
            "dpop": [:],
        ]
    }

    private func jkt(_ relay: TokenRelayProcess) throws -> String? {
        let status = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/status").json()
        return (status?["dpop"] as? [String: Any])?["jkt"] as? String
    }

    /// Two relays started at once on a record without a key: one key in Redis, both sign with it; a refresh
    /// by one, and requests through the other carry the token bound to that key (the API checks cnf.jkt).
    func testTwoRelaysStartedAtOnceSignWithTheOneKeyKeptInRedis() throws {
        let sealingKey = try writeKey(workDir, "state-key")
        let configURL = workDir.appendingPathComponent("import.json")
        try JSONSerialization.data(withJSONObject: config(sealingKey: sealingKey.url)).write(to: configURL)
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path])
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)

        let started = Locked([TokenRelayProcess?](repeating: nil, count: 2))
        let relayConfig = config(sealingKey: sealingKey.url)
        let directories = (0..<2).map { workDir.appendingPathComponent("relay-\($0)") }
        for directory in directories { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
        nonisolated(unsafe) let shared = relayConfig  // read-only from both threads
        DispatchQueue.concurrentPerform(iterations: 2) { index in
            let relay: TokenRelayProcess?
            do { relay = try TokenRelayProcess.start(config: shared, workDir: directories[index]) } catch { print("start \(index): \(error)"); relay = nil }
            started.withLock { $0[index] = relay }
        }
        relays = started.withLock { $0 }.compactMap { $0 }
        XCTAssertEqual(relays.count, 2, "both relays started")
        guard relays.count == 2 else { return }
        let (first, second) = (relays[0], relays[1])

        // One key in the record, sealed: no PEM in Redis in clear; both relays report its thumbprint.
        let stored = try redis.cli(["HGET", key, "dpop_key"])
        XCTAssertFalse(stored.isEmpty, "the key is kept in the Redis record")
        XCTAssertFalse(stored.contains("PRIVATE KEY"), "the key is sealed under tokens.encryption")
        XCTAssertNoThrow(try sealedEnvelope(Data(stored.utf8)))
        let firstJKT = try XCTUnwrap(try jkt(first))
        XCTAssertEqual(try jkt(second), firstJKT, "both relays sign with the same key")
        let generated = relays.filter { $0.stderrText.contains("dpop: generated a ES256 key") }.count
        XCTAssertLessThanOrEqual(generated, 1, "at most one relay's key was kept (the other adopted it)")

        // A refresh by the first relay; the second adopts the bound tokens and uses them without a refresh.
        for index in 0..<6 {
            XCTAssertEqual(try HTTPTestClient.send(port: first.proxyPort, method: "GET", path: "/a/\(index)").status, 200)
        }
        XCTAssertEqual(try server.count("granted"), 1)
        XCTAssertTrue(waitUntil(timeout: 10) {
            (try? HTTPTestClient.send(port: second.proxyPort, method: "GET", path: "/b/0").status) == 200
        }, "requests through the second relay work with the bound token")
        for index in 1..<10 {
            XCTAssertEqual(try HTTPTestClient.send(port: second.proxyPort, method: index % 2 == 0 ? "GET" : "POST", path: "/b/\(index)",
                                                   body: index % 2 == 0 ? nil : Data("{}".utf8)).status, 200)
        }
        let stats = try server.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1, "one refresh for the fleet")
        XCTAssertEqual(Set(stats["jkts"] as? [String] ?? []), [firstJKT], "the tokens are bound to the key both relays hold")
        XCTAssertEqual(stats["proof_failures"] as? [String], [])
        XCTAssertEqual(stats["jti_reuse"] as? Int, 0)
        XCTAssertEqual(stats["refresh_token_reuse"] as? Int, 0)

        // A restarted relay finds the key in Redis, not a new one.
        relays[1].stop()
        let directory = workDir.appendingPathComponent("relay-restarted")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let restarted = try TokenRelayProcess.start(config: config(sealingKey: sealingKey.url), workDir: directory)
        relays.append(restarted)
        XCTAssertEqual(try jkt(restarted), firstJKT)
        XCTAssertFalse(restarted.stderrText.contains("dpop: generated"))
        XCTAssertEqual(try HTTPTestClient.send(port: restarted.proxyPort, method: "GET", path: "/c").status, 200)
        for relay in relays { XCTAssertFalse(relay.stderrText.contains("PRIVATE KEY"), "a key was logged") }
    }

    /// The record's key field gone while its token set is there (a Redis restarted without persistence, and
    /// the relays' put-back of the set they held, which carries the key): a relay starting then stores that
    /// key again and signs with it, not with a new key the fleet's tokens are not bound to.
    func testARelayStartingAfterTheKeyFieldWasLostTakesTheKeyTheTokenSetCarries() throws {
        let configURL = workDir.appendingPathComponent("import.json")
        try JSONSerialization.data(withJSONObject: config(sealingKey: nil)).write(to: configURL)
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path])
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)
        let directories = (0..<2).map { workDir.appendingPathComponent("lost-key-\($0)") }
        for directory in directories { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
        let first = try TokenRelayProcess.start(config: config(sealingKey: nil), workDir: directories[0])
        relays.append(first)
        // Until the relay's Redis connection is up a request gets 503 (no refresh without the store).
        XCTAssertTrue(waitUntil(timeout: 10) { (try? HTTPTestClient.send(port: first.proxyPort, method: "GET", path: "/a").status) == 200 },
                      first.stderrText)
        XCTAssertEqual(try server.count("granted"), 1)
        let firstJKT = try XCTUnwrap(try jkt(first))

        XCTAssertEqual(try redis.cli(["HDEL", key, "dpop_key"]), "1")
        let second = try TokenRelayProcess.start(config: config(sealingKey: nil), workDir: directories[1])
        relays.append(second)
        XCTAssertEqual(try jkt(second), firstJKT, "the key the token set carries, not a new one")
        XCTAssertFalse(second.stderrText.contains("dpop: generated"))
        XCTAssertFalse(try redis.cli(["HGET", key, "dpop_key"]).isEmpty, "the field is stored again")
        XCTAssertEqual(try HTTPTestClient.send(port: second.proxyPort, method: "GET", path: "/b").status, 200)
        let stats = try server.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1, "no refresh: the bound token works through the second relay")
        XCTAssertEqual(stats["proof_failures"] as? [String], [])
        XCTAssertEqual(stats["refresh_token_reuse"] as? Int, 0)
    }

    /// The record loses `dpop_key` while a relay runs (an operator's HDEL, a partial restore; a flush or a
    /// recreated record lose it too): the relay's next write of the record stores its key again (HSETNX, sealed
    /// as at start) and says so, so the field holds the key the fleet's tokens are bound to and a relay started
    /// later reads it there instead of generating one.
    func testARunningRelayStoresItsKeyAgainAtItsNextWriteWhenTheRecordLostIt() throws {
        let sealingKey = try writeKey(workDir, "state-key")
        let relayConfig = config(sealingKey: sealingKey.url)
        let configURL = workDir.appendingPathComponent("import.json")
        try JSONSerialization.data(withJSONObject: relayConfig).write(to: configURL)
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path])
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)
        let directories = (0..<2).map { workDir.appendingPathComponent("restore-\($0)") }
        for directory in directories { try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true) }
        let first = try TokenRelayProcess.start(config: relayConfig, workDir: directories[0])
        relays.append(first)
        let firstJKT = try XCTUnwrap(try jkt(first))
        XCTAssertFalse(try redis.cli(["HGET", key, "dpop_key"]).isEmpty, "stored at start")
        XCTAssertEqual(try redis.cli(["HDEL", key, "dpop_key"]), "1")

        // The first request refreshes (the seeded token is not the server's): the relay's next write.
        XCTAssertTrue(waitUntil(timeout: 10) { (try? HTTPTestClient.send(port: first.proxyPort, method: "GET", path: "/a").status) == 200 },
                      first.stderrText)
        XCTAssertEqual(try server.count("granted"), 1)
        let stored = try redis.cli(["HGET", key, "dpop_key"])
        XCTAssertFalse(stored.isEmpty, "the write stored the key again")
        XCTAssertFalse(stored.contains("PRIVATE KEY"), "sealed under tokens.encryption, as at start")
        XCTAssertNoThrow(try sealedEnvelope(Data(stored.utf8)))
        XCTAssertTrue(first.stderrText.contains("dpop: the Redis record had lost its dpop_key field"), first.stderrText)

        // Relays started now read that key (not generated, not recovered from elsewhere) and serve with the bound tokens.
        let second = try TokenRelayProcess.start(config: relayConfig, workDir: directories[1])
        relays.append(second)
        XCTAssertEqual(try jkt(second), firstJKT)
        XCTAssertFalse(second.stderrText.contains("dpop: generated"))
        XCTAssertEqual(try HTTPTestClient.send(port: second.proxyPort, method: "GET", path: "/b").status, 200)
        let stats = try server.stats()
        XCTAssertEqual(stats["proof_failures"] as? [String], [])
        XCTAssertEqual(stats["refresh_token_reuse"] as? Int, 0)
        XCTAssertEqual(Set(stats["jkts"] as? [String] ?? []), [firstJKT])
        for relay in relays { XCTAssertFalse(relay.stderrText.contains("PRIVATE KEY"), "a key was logged") }
    }

    /// `tokenrelay login` in fleet mode: the polls are signed with the key it stores in the Redis record (none was
    /// there), and a relay started after it signs with that key: the login's bound tokens work at once.
    func testLoginInFleetModeStoresTheKeyTheRelaysThenUse() throws {
        var loginConfig = config(sealingKey: nil)
        loginConfig["login"] = ["device_authorization_url": "http://127.0.0.1:\(server.tokenPort)/device"]
        let url = workDir.appendingPathComponent("login.json")
        try JSONSerialization.data(withJSONObject: loginConfig).write(to: url)
        let result = try TokenRelayProcess.runCommand(arguments: ["login", "--config", url.path, "--poll-interval-scale", "0.01"], timeout: 30)
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("tokens stored in Redis"), result.stdout)
        XCTAssertTrue(try redis.cli(["HGET", key, "dpop_key"]).contains("PRIVATE KEY"), "the key is in the record (clear: no tokens.encryption)")
        let loginJKT = try XCTUnwrap((try server.stats()["jkts"] as? [String])?.first)

        let directory = workDir.appendingPathComponent("relay-after-login")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let relay = try TokenRelayProcess.start(config: loginConfig, workDir: directory)
        relays.append(relay)
        XCTAssertEqual(try jkt(relay), loginJKT)
        XCTAssertTrue(relay.stderrText.contains("dpop: the generated key is stored in clear in the Redis record"), relay.stderrText)
        for index in 0..<3 {
            XCTAssertEqual(try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/l/\(index)").status, 200)
        }
        let stats = try server.stats()
        XCTAssertEqual(stats["granted"] as? Int, 1, "the login's grant only")
        XCTAssertEqual(stats["proof_failures"] as? [String], [])
    }

    /// Redis down at start and no local cache holding the key: no start (a key of its own would bind tokens the
    /// rest of the fleet cannot use), with one line saying so.
    func testARelayThatCannotReadTheKeyFromRedisDoesNotStart() throws {
        redis.stop()
        let directory = workDir.appendingPathComponent("relay-no-redis")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        XCTAssertThrowsError(try TokenRelayProcess.start(config: config(sealingKey: nil), workDir: directory)) { error in
            XCTAssertTrue("\(error)".contains("dpop: the key kept in Redis cannot be read"), "\(error)")
        }
    }
}
