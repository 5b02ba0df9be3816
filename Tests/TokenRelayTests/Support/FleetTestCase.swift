import Foundation
import TLSFixtures
import XCTest

/// Fleet mode end to end: real tokenrelay processes sharing one identity through a real redis-server,
/// against the fake token server that rotates refresh tokens and revokes the family on reuse.
class FleetTestCase: RelayTestCase {
    var redis: RedisServerProcess!
    let key = "tokenrelay:fleet-test"
    /// Whether the test's redis-server also listens on a 127.0.0.1 port (a replica connects over TCP).
    var redisListensOnTCP: Bool { false }
    /// Whether it also listens for TLS (`redis.tlsPort`, the shared test PKI's server certificate).
    var redisListensOnTLS: Bool { false }

    override func setUpWithError() throws {
        try super.setUpWithError()
        redis = try RedisServerProcess(appendOnly: true, tcp: redisListensOnTCP, tls: redisListensOnTLS ? TestPKI.shared() : nil)
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        redis?.stop()
        redis = nil
    }

    func fleetConfig(_ redisOverrides: [String: Any] = [:], cache: Bool = false) -> [String: Any] {
        var redisSettings: [String: Any] = ["url": redis.url, "key": key, "command_timeout_seconds": 0.5, "poll_interval_seconds": 0.1]
        redisSettings.merge(redisOverrides) { _, new in new }
        var tokens: [String: Any] = ["redis": redisSettings, "watch_interval_seconds": 0.2]
        // startRelay merges this over the base config, whose tokens.file is the single-host token file:
        // null removes it (no cache) unless the test wants the cache.
        if cache { tokens["file"] = tokenFileURL.path } else { tokens["file"] = NSNull() }
        var config = config(["timeouts": ["refresh_seconds": 2, "hold_seconds": 15]])
        config["tokens"] = tokens
        return config
    }

    /// `tokenrelay token import` into Redis (the token file written in setUp is the input).
    func importTokens(expectingVersion version: Int = 1) throws {
        let configURL = workDir.appendingPathComponent("import-config.json")
        try JSONSerialization.data(withJSONObject: fleetConfig()).write(to: configURL)
        let result = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
        XCTAssertTrue(result.stdout.contains("version \(version):"), result.stdout)
    }

    func startFleet(_ count: Int, _ redisOverrides: [String: Any] = [:]) throws -> [TokenRelayProcess] {
        let relays = try (0..<count).map { _ in try startRelay(fleetConfig(redisOverrides)) }
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, "relay not ready: \(relay.stderrText.suffix(2000))")
        }
        return relays
    }

    func storedVersion() throws -> Int {
        Int(try redis.cli(["HGET", key, "version"])) ?? 0
    }

    func status(_ relay: TokenRelayProcess) throws -> [String: Any] {
        let body = try admin(relay, "/status").body
        return try XCTUnwrap(JSONSerialization.jsonObject(with: body) as? [String: Any])
    }

}
