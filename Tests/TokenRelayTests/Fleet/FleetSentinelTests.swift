import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// `tokens.redis.sentinel` against real processes: a master, two replicas and three sentinels on
/// 127.0.0.1 (`RedisSentinelGroup`). Two replicas, not one: with `wait_replicas: 1` the promoted master
/// needs a replica of its own to acknowledge writes once the old master is dead.
class FleetSentinelTestCase: FleetTestCase {
    var group: RedisSentinelGroup!

    override func setUpWithError() throws {
        try super.setUpWithError()
        group = try RedisSentinelGroup()
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        group?.stop()
        group = nil
    }

    func sentinelConfig(_ redisOverrides: [String: Any] = [:], hold: Double = 15) -> [String: Any] {
        var config = fleetConfig(redisOverrides)
        var tokens = config["tokens"] as? [String: Any] ?? [:]
        var redisSettings = tokens["redis"] as? [String: Any] ?? [:]
        redisSettings["url"] = nil
        redisSettings["sentinel"] = ["addresses": (group.extraAddressFirst.map { [$0] } ?? []) + group.addresses, "master": group.masterName]
        tokens["redis"] = redisSettings
        config["tokens"] = tokens
        config["timeouts"] = ["refresh_seconds": 2, "hold_seconds": hold]
        return config
    }

    /// `token import` with the sentinel config: the command line finds the master through the sentinels too.
    func importThroughSentinels() throws {
        let configURL = workDir.appendingPathComponent("sentinel-import-config.json")
        try JSONSerialization.data(withJSONObject: sentinelConfig()).write(to: configURL)
        let result = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("version 1:"), result.stdout)
    }

    func startSentinelFleet(_ count: Int, _ redisOverrides: [String: Any] = [:], hold: Double = 15) throws -> [TokenRelayProcess] {
        let relays = try (0..<count).map { _ in try startRelay(sentinelConfig(redisOverrides, hold: hold)) }
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, "relay not ready: \(relay.stderrText.suffix(2000))")
        }
        return relays
    }

    func master(_ relay: TokenRelayProcess) -> [String: Any] {
        ((try? status(relay)["token_store"] as? [String: Any])?["master"] as? [String: Any]) ?? [:]
    }

    /// Whether the relay is ready and connected to the node on `port`.
    func follows(_ relay: TokenRelayProcess, port: Int) -> Bool {
        guard (master(relay)["address"] as? String) == "127.0.0.1:\(port)/0" else { return false }
        let store = (try? status(relay)["token_store"] as? [String: Any]) ?? [:]
        return store["connected"] as? Bool == true && (try? admin(relay, "/readyz").status) == 200
    }
}

final class FleetSentinelTests: FleetSentinelTestCase {
    func testRelaysFindTheMasterThroughTheSentinels() throws {
        // A sentinel that does not answer comes first: the others are asked in turn.
        group.extraAddressFirst = "127.0.0.1:\(try RedisServerProcess.freeLoopbackPort())"
        try importThroughSentinels()
        let masterPort = try XCTUnwrap(group.nodes[0].tcpPort)
        XCTAssertEqual(try group.nodes[0].cli(["HGET", key, "version"]), "1", "the import went to the master")
        let relays = try startSentinelFleet(2)
        for relay in relays {
            XCTAssertTrue(follows(relay, port: masterPort), "\(master(relay))")
            let found = master(relay)["found_by"] as? String ?? ""
            XCTAssertTrue(found.contains("sentinel master \(group.masterName)"), found)
            XCTAssertEqual(master(relay)["failovers_followed"] as? Int, 0)
        }
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[1], "/through-sentinel").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(try group.nodes[0].cli(["HGET", key, "version"]), "2")
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.group.nodes[1].cli(["HGET", self.key, "version"])) == "2" }, "replicated")
    }

    /// The master SIGKILLed: the sentinels promote a replica, every relay follows by itself (the
    /// announcement, or its own re-asking), is ready again and serves; a burst after the failover makes
    /// exactly one refresh fleet-wide, with no reuse, and the new master holds the latest rotation.
    func testAFailoverIsFollowedAndABurstAfterItRefreshesOnce() throws {
        try importThroughSentinels()
        let relays = try startSentinelFleet(3, ["wait_replicas": 1])
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[0], "/before").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        let oldPort = try XCTUnwrap(group.nodes[0].tcpPort)

        group.nodes[0].kill9()
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { (self.group.masterPortNamedBySentinels ?? oldPort) != oldPort },
                      "the sentinels promoted a replica")
        let newPort = try XCTUnwrap(group.masterPortNamedBySentinels)
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 15, interval: 0.05) { self.follows(relay, port: newPort) },
                          "relay follows the new master by itself: \(master(relay)) \(relay.stderrText.suffix(1500))")
            XCTAssertEqual(master(relay)["failovers_followed"] as? Int, 1)
            let last = master(relay)["last_failover"] as? [String: Any] ?? [:]
            XCTAssertEqual(last["from"] as? String, "127.0.0.1:\(oldPort)/0")
            XCTAssertEqual(last["to"] as? String, "127.0.0.1:\(newPort)/0")
            XCTAssertTrue(try admin(relay, "/metrics").bodyText.contains("tokenrelay_token_store_failovers_followed_total 1"))
        }
        let newMaster = try XCTUnwrap(group.node(port: newPort))
        XCTAssertEqual(try newMaster.cli(["HGET", key, "version"]), "2", "the acknowledged rotation survived the failover")

        tokenServer.expireAccessTokens()
        let responses = burst(30) { index in
            try HTTPTestClient.send(port: relays[index % relays.count].proxyPort, method: "GET", path: "/after-failover/\(index)")
        }
        XCTAssertEqual(statusCounts(responses), [200: 30])
        XCTAssertEqual(tokenServer.successfulRefreshes, 2, "exactly one refresh fleet-wide after the failover")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        let stored = try newMaster.cli(["HGET", key, "tokens"])
        XCTAssertTrue(stored.contains(try XCTUnwrap(tokenServer.currentRefreshToken)), "the new master holds the latest rotation")
        for relay in relays {
            XCTAssertFalse(try admin(relay, "/status").bodyText.contains(tokenServer.currentRefreshToken ?? "-"), "no token in /status")
        }
    }

    /// A write lost on purpose (`wait_replicas: 0`): the replicas are cut off from the master (a wrong
    /// `masterauth`, their link dropped) before a rotation, the master SIGKILLed after it, and the
    /// sentinels promote a replica that never got it. A relay that saw the newer set writes it back before
    /// anyone refreshes: the next refresh presents the latest refresh token, no reuse.
    func testAWriteLostInAFailoverIsPutBack() throws {
        try importThroughSentinels()
        let relays = try startSentinelFleet(2)
        for replica in group.nodes.dropFirst() {
            try replica.cli(["CONFIG", "SET", "masterauth", "not-the-password"])
            try replica.cli(["CLIENT", "KILL", "TYPE", "master"])
        }
        XCTAssertTrue(waitUntil(timeout: 10) {
            self.group.nodes.dropFirst().allSatisfy { ((try? $0.cli(["INFO", "replication"])) ?? "").contains("master_link_status:down") }
        })
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[0], "/rotated").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertTrue(waitUntil(timeout: 5) { relays.allSatisfy { (try? self.status($0)["token_store"] as? [String: Any])?["version"] as? Int == 2 } },
                      "both relays hold version 2")
        XCTAssertEqual(try group.nodes[1].cli(["HGET", key, "version"]), "1", "the replicas never got version 2")
        XCTAssertEqual(try group.nodes[2].cli(["HGET", key, "version"]), "1")

        let oldPort = try XCTUnwrap(group.nodes[0].tcpPort)
        group.nodes[0].kill9()
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { (self.group.masterPortNamedBySentinels ?? oldPort) != oldPort },
                      "the sentinels promoted a replica")
        let newMaster = try XCTUnwrap(group.currentMaster)
        XCTAssertTrue(waitUntil(timeout: 15) {
            ((try? newMaster.cli(["HGET", self.key, "tokens"])) ?? "").contains(self.tokenServer.currentRefreshToken ?? "-")
        }, "the newer set written back to the new master: \(relays.map { $0.stderrText.suffix(1200) })")
        var putBack = 0
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 })
            let metrics = try admin(relay, "/metrics").bodyText
            if metrics.contains("tokenrelay_token_store_writes_put_back_total 1") { putBack += 1 }
        }
        XCTAssertEqual(putBack, 1, "written back once, by one relay")

        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relays[1], "/after-put-back").status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 2)
        XCTAssertEqual(tokenServer.reuseDetections, 0, "the refresh token the lost write burnt was never presented")
    }
}

/// A graceful failover (`SENTINEL FAILOVER`: the old master stays up and turns replica) with the first
/// sentinel dead: the relays' lookups and their `+switch-master` subscription move to the others, and every
/// relay leaves the demoted node for the promoted one by itself.
final class FleetSentinelSwitchTests: FleetSentinelTestCase {
    func testARequestedFailoverIsFollowedWithTheFirstSentinelGone() throws {
        try importThroughSentinels()
        let relays = try startSentinelFleet(2)
        group.sentinels[0].stop()
        let oldPort = try XCTUnwrap(group.nodes[0].tcpPort)
        XCTAssertEqual(try group.sentinels[1].cli(["SENTINEL", "FAILOVER", group.masterName]), "OK")
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { (self.group.masterPortNamedBySentinels ?? oldPort) != oldPort },
                      "the sentinels switched the master")
        let newPort = try XCTUnwrap(group.masterPortNamedBySentinels)
        let switched = Date()
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 15, interval: 0.05) { self.follows(relay, port: newPort) },
                          "\(master(relay)) \(relay.stderrText.suffix(1500))")
            XCTAssertEqual(master(relay)["failovers_followed"] as? Int, 1)
        }
        // The old master is reconfigured as a replica only at the sentinels' next look at it (about 10 s
        // here): the relays moved off a node that still says master, on the announcement or the lookup.
        print("requested failover: relays followed \(Date().timeIntervalSince(switched)) s after the sentinels switched")
        tokenServer.expireAccessTokens()
        let responses = burst(10) { index in
            try HTTPTestClient.send(port: relays[index % relays.count].proxyPort, method: "GET", path: "/after-switch/\(index)")
        }
        XCTAssertEqual(statusCounts(responses), [200: 10])
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try XCTUnwrap(group.node(port: newPort)).cli(["HGET", key, "version"]), "2", "written to the new master")
    }
}

extension FleetSentinelTests {
    /// A sentinel that stops answering without closing its connection (SIGSTOP): the `+switch-master`
    /// subscription on it is PINGed, found silent within the command timeout, and moved to the next
    /// sentinel, whose announcement of a failover requested meanwhile is followed.
    func testAStalledSentinelSubscriptionMovesToTheNextSentinel() throws {
        try importThroughSentinels()
        let relay = try XCTUnwrap(try startSentinelFleet(1).first)
        let stalled = try XCTUnwrap(group.sentinels[0].pid)
        XCTAssertEqual(kill(stalled, SIGSTOP), 0)
        defer { kill(stalled, SIGCONT) }
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.1) { relay.stderrText.contains("lost the sentinel subscription") },
                      relay.stderrText.suffix(1500).description)
        XCTAssertTrue(relay.stderrText.contains("127.0.0.1:\(group.sentinels[0].port)"), "the line names the silent sentinel")
        let oldPort = try XCTUnwrap(group.nodes[0].tcpPort)
        XCTAssertEqual(try group.sentinels[1].cli(["SENTINEL", "FAILOVER", group.masterName]), "OK")
        XCTAssertTrue(waitUntil(timeout: 20, interval: 0.05) { (self.group.masterPortNamedBySentinels(skipping: 0) ?? oldPort) != oldPort },
                      "the sentinels switched the master")
        let newPort = try XCTUnwrap(group.masterPortNamedBySentinels(skipping: 0))
        XCTAssertTrue(waitUntil(timeout: 15, interval: 0.05) { self.follows(relay, port: newPort) }, "\(master(relay)) \(relay.stderrText.suffix(1500))")
        XCTAssertEqual(try get(relay, "/after-switch").status, 200)
    }
}

/// Sentinels that require a password (`sentinel.password_env`): found with it; a wrong one leaves the
/// relay unreachable with the sentinel's refusal as the reason, and the password in no log line or
/// /status.
final class FleetSentinelLoginTests: FleetTestCase {
    private var group: RedisSentinelGroup!
    private let password = "sentinel-secret-4f1c9a"

    override func setUpWithError() throws {
        try super.setUpWithError()
        group = try RedisSentinelGroup(replicaCount: 1, sentinelPassword: password)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        group?.stop()
        group = nil
    }

    private func config(password variable: String) -> [String: Any] {
        var config = fleetConfig()
        var tokens = config["tokens"] as? [String: Any] ?? [:]
        var redisSettings = tokens["redis"] as? [String: Any] ?? [:]
        redisSettings["url"] = nil
        redisSettings["sentinel"] = ["addresses": group.addresses, "master": group.masterName, "password_env": variable]
        tokens["redis"] = redisSettings
        config["tokens"] = tokens
        return config
    }

    func testSentinelsWithAPasswordAreAskedWithIt() throws {
        let masterPort = try XCTUnwrap(group.nodes[0].tcpPort)
        try group.nodes[0].cli(["HSET", key, "version", "1", "tokens", String(data: try Data(contentsOf: tokenFileURL), encoding: .utf8) ?? ""])
        let good = try startRelay(config(password: "TOKENRELAY_SENTINEL_PASSWORD"), environment: ["TOKENRELAY_SENTINEL_PASSWORD": password])
        let bad = try startRelay(config(password: "TOKENRELAY_SENTINEL_PASSWORD"), environment: ["TOKENRELAY_SENTINEL_PASSWORD": "wrong-password-77"])
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(good, "/readyz").status) == 200 }, good.stderrText.suffix(1500).description)
        let found = (try status(good)["token_store"] as? [String: Any])?["master"] as? [String: Any] ?? [:]
        XCTAssertEqual(found["address"] as? String, "127.0.0.1:\(masterPort)/0")
        var reason = ""
        XCTAssertTrue(waitUntil(timeout: 10) {
            reason = ((try? self.status(bad)["token_store"] as? [String: Any])?["unreachable_reason"] as? String) ?? ""
            return reason.contains("authentication failed")
        }, reason)
        XCTAssertTrue(reason.contains("no sentinel named the master"), reason)
        for relay in [good, bad] {
            let texts = [relay.stderrText, try admin(relay, "/status").bodyText, try admin(relay, "/metrics").bodyText]
            for text in texts {
                XCTAssertFalse(text.contains(password), "the sentinels' password never shows")
                XCTAssertFalse(text.contains("wrong-password-77"), "nor a wrong one")
            }
        }
    }
}
