import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Fleet mode end to end: real tokenrelay processes sharing one identity through a real redis-server,
/// against the fake token server that rotates refresh tokens and revokes the family on reuse.
final class FleetTests: RelayTestCase {
    override var accessTokenLifetime: Double? { 3600 }
    private var redis: RedisServerProcess!
    private let key = "tokenrelay:fleet-test"

    override func setUpWithError() throws {
        try super.setUpWithError()
        redis = try RedisServerProcess(appendOnly: true)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        redis?.stop()
        redis = nil
    }

    private func fleetConfig(_ redisOverrides: [String: Any] = [:], cache: Bool = false) -> [String: Any] {
        var redisSettings: [String: Any] = ["url": redis.url, "key": key, "command_timeout_seconds": 0.5, "poll_interval_seconds": 0.1]
        redisSettings.merge(redisOverrides) { _, new in new }
        var tokens: [String: Any] = ["redis": redisSettings, "watch_interval_seconds": 0.2]
        if cache { tokens["file"] = tokenFileURL.path }
        var config = config(["timeouts": ["refresh_seconds": 2, "hold_seconds": 15]])
        config["tokens"] = tokens
        return config
    }

    /// `tokenrelay token import` into Redis (the token file written in setUp is the input).
    private func importTokens() throws {
        let configURL = workDir.appendingPathComponent("import-config.json")
        try JSONSerialization.data(withJSONObject: fleetConfig()).write(to: configURL)
        let result = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("version 1"), result.stdout)
    }

    private func startFleet(_ count: Int, _ redisOverrides: [String: Any] = [:]) throws -> [TokenRelayProcess] {
        let relays = try (0..<count).map { _ in try startRelay(fleetConfig(redisOverrides)) }
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, "relay not ready: \(relay.stderrText.suffix(2000))")
        }
        return relays
    }

    private func storedVersion() throws -> Int {
        Int(try redis.cli(["HGET", key, "version"])) ?? 0
    }

    private func status(_ relay: TokenRelayProcess) throws -> [String: Any] {
        let body = try admin(relay, "/status").body
        return try XCTUnwrap(JSONSerialization.jsonObject(with: body) as? [String: Any])
    }

    /// The issue's first test: 5 relays, 50 requests spread over them after expiry: all 200, exactly one
    /// refresh fleet-wide, no reuse; the other four adopt the published version.
    func testBurstAfterExpiryOverFiveRelaysRefreshesOnceFleetWide() throws {
        try importTokens()
        let relays = try startFleet(5)
        let ports = relays.map(\.proxyPort)
        tokenServer.expireAccessTokens()
        let responses = burst(50) { index in
            try HTTPTestClient.send(port: ports[index % ports.count], method: "GET", path: "/burst/\(index)")
        }
        XCTAssertEqual(statusCounts(responses), [200: 50])
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "exactly one refresh fleet-wide")
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try storedVersion(), 2)
        var adopted = 0
        for relay in relays {
            let store = try XCTUnwrap(try status(relay)["token_store"] as? [String: Any])
            XCTAssertEqual(store["kind"] as? String, "redis")
            XCTAssertEqual(store["version"] as? Int, 2)
            XCTAssertEqual(store["connected"] as? Bool, true)
            if store["last_adoption"] is [String: Any] { adopted += 1 }
            XCTAssertFalse(try admin(relay, "/status").bodyText.contains(tokenServer.currentAccessToken ?? "-"), "no token in /status")
        }
        XCTAssertEqual(adopted, 4, "every relay but the refreshing one adopted the new version")
    }

    /// A lock holder that died before its refresh request left (its lock is never released): the others
    /// wait for the lock to expire, then exactly one refreshes; no reuse.
    func testALockLeftByADeadHolderExpiresAndAnotherRelayTakesOver() throws {
        try importTokens()
        let relays = try startFleet(3, ["lock_seconds": 3.5])
        // The holder's state as a SIGKILL leaves it: the lock in Redis, nobody to release it.
        try redis.cli(["SET", key + ":lock", "dead-host/4242/0", "PX", "1500"])
        tokenServer.expireAccessTokens()
        let started = Date()
        let responses = burst(12) { index in
            try HTTPTestClient.send(port: relays[index % relays.count].proxyPort, method: "GET", path: "/after-death/\(index)")
        }
        XCTAssertEqual(statusCounts(responses), [200: 12])
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 1.0, "nobody refreshed before the dead holder's lock expired")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// The lock holder SIGKILLed while its refresh request is at the token server: the rotation it
    /// received dies with it, so the next relay presents a refresh token the server has rotated (reuse is
    /// unavoidable then) and the server revokes the family. What must not happen is a storm: the refusal
    /// latches "login required" fleet-wide and no relay tries again on its own.
    func testAHolderKilledWhileItsRefreshIsAtTheTokenServerDoesNotStorm() throws {
        try importTokens()
        let relays = try startFleet(3, ["lock_seconds": 3.5])
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let first = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relays[0].proxyPort, method: "GET", path: "/victim") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls == 1 })
        kill(relays[0].pid, SIGKILL)
        XCTAssertNotNil(relays[0].waitForExit(timeout: 5))
        _ = try? first.wait(timeout: 5)
        tokenServer.openGate()
        tokenServer.failureMode = .normal
        // The next request on another relay waits for the lock to expire, presents the old refresh token:
        // the server sees reuse and refuses; login required everywhere.
        XCTAssertEqual(try get(relays[1], "/next").status, 401)
        XCTAssertTrue(waitUntil(timeout: 5) {
            (try? self.status(relays[2])["state"] as? String) == "login_required"
        }, "the latch reached the other relay")
        let calls = tokenServer.refreshCalls
        XCTAssertEqual(calls, 2, "one rotation lost with the killed holder, one refused presentation: no storm")
        for index in 0..<6 { _ = try? get(relays[1 + index % 2], "/more/\(index)") }
        XCTAssertEqual(tokenServer.refreshCalls, calls, "latched: nobody tries again")
        XCTAssertEqual(try redis.cli(["HEXISTS", key, "login_required"]), "1")
    }

    /// Redis stopped while the tokens are valid: no client sees an error; once back, the relays reconnect.
    func testRedisDownWhileTokensAreValidKeepsServing() throws {
        try importTokens()
        let relays = try startFleet(2)
        redis.stop()
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.status(relays[0])["token_store"] as? [String: Any])?["connected"] as? Bool == false })
        for index in 0..<10 { XCTAssertEqual(try get(relays[index % 2], "/during/\(index)").status, 200) }
        XCTAssertEqual(try admin(relays[0], "/readyz").status, 200, "a valid token keeps the relay ready")
        try redis.start()
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.status(relays[1])["token_store"] as? [String: Any])?["connected"] as? Bool == true })
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }

    /// Redis stopped across an expiry: clean 503 with Retry-After, no refresh attempted, /readyz 503 and
    /// /status say why; with Redis back the fleet recovers by itself (one refresh, no reuse).
    func testRedisDownAcrossExpiryAnswers503WithoutRefreshingAndRecovers() throws {
        try importTokens()
        let relays = try startFleet(2)
        redis.stop()
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.status(relays[0])["token_store"] as? [String: Any])?["connected"] as? Bool == false })
        tokenServer.expireAccessTokens()
        for index in 0..<6 {
            let response = try get(relays[index % 2], "/dead/\(index)")
            XCTAssertEqual(response.status, 503, response.bodyText)
            XCTAssertNotNil(response.header("Retry-After"))
        }
        let readiness = try admin(relays[0], "/readyz")
        XCTAssertEqual(readiness.status, 503)
        XCTAssertTrue(try admin(relays[0], "/status").bodyText.contains("token store unreachable"))
        XCTAssertEqual(tokenServer.refreshCalls, 0, "no relay refreshes alone")
        try redis.start()
        XCTAssertTrue(waitUntil(timeout: 10) {
            relays.allSatisfy { (try? self.get($0, "/back").status) == 200 }
        }, "recovered by itself")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// Redis restarted with its append-only file: the token set and its version survive.
    func testTokenSetAndVersionSurviveARedisRestartWithAOF() throws {
        try importTokens()
        let relays = try startFleet(2)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[0], "/rotate").status, 200)
        XCTAssertEqual(try storedVersion(), 2)
        let stored = try redis.cli(["HGET", key, "tokens"])
        try redis.restart()
        XCTAssertEqual(try storedVersion(), 2)
        XCTAssertEqual(try redis.cli(["HGET", key, "tokens"]), stored)
        tokenServer.expireAccessTokens()
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.get(relays[1], "/after-restart").status) == 200 })
        XCTAssertEqual(try storedVersion(), 3)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// A forced compare-and-set conflict: while a relay's refresh is at the token server, a newer version
    /// is stored (an operator's import). The relay's write loses; it adopts the stored tokens.
    func testAStaleWriterLosesItsCompareAndSetAndAdoptsTheStoredVersion() throws {
        try importTokens()
        let relays = try startFleet(1)
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let pending = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relays[0].proxyPort, method: "GET", path: "/racing") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls == 1 })
        let operatorTokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: operatorTokens.access, refresh: operatorTokens.refresh)
        try importTokens2()
        XCTAssertEqual(try storedVersion(), 2)
        tokenServer.openGate()
        let response = try pending.wait(timeout: 10)
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(try storedVersion(), 2, "the stale write did not land")
        XCTAssertTrue(try redis.cli(["HGET", key, "tokens"]).contains(operatorTokens.access))
        XCTAssertTrue(try admin(relays[0], "/metrics").bodyText.contains("tokenrelay_token_store_cas_conflicts_total 1"))
        XCTAssertEqual(try get(relays[0], "/after").status, 200)
    }

    private func importTokens2() throws {
        let configURL = workDir.appendingPathComponent("import-config.json")
        let result = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
    }
}
