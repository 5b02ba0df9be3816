import Foundation
import TLSFixtures
import XCTest

/// Fleet mode over `rediss://`: relays reach a real redis-server through TLS (its certificate from the
/// throwaway test PKI), with a Redis password that must never reach a log line.
final class FleetTLSTests: FleetTestCase {
    override var redisListensOnTLS: Bool { true }
    private let password = "canary-redis-tls-password-91c4"

    private func tlsConfig(caFile: URL) throws -> [String: Any] {
        let port = try XCTUnwrap(redis.tlsPort)
        return fleetConfig(["url": "rediss://127.0.0.1:\(port)/0", "tls": ["ca_file": caFile.path],
                            "password_env": "TOKENRELAY_REDIS_PASSWORD"])
    }

    private var environment: [String: String] {
        ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret, "TOKENRELAY_REDIS_PASSWORD": password]
    }

    private func directory(_ name: String) throws -> URL {
        let url = workDir.appendingPathComponent(name)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// `token import` and two relays over TLS: the burst after expiry refreshes once fleet-wide, both relays
    /// serve with the new token, and the password appears in no log line.
    func testFleetOverRedissRefreshesOnceAndServes() throws {
        let pki = try TestPKI.shared()
        try redis.cli(["CONFIG", "SET", "requirepass", password])
        defer { _ = try? redis.cli(["-a", password, "--no-auth-warning", "CONFIG", "SET", "requirepass", ""]) }
        let config = try tlsConfig(caFile: pki.caFile)
        let configURL = workDir.appendingPathComponent("rediss-config.json")
        try JSONSerialization.data(withJSONObject: config).write(to: configURL)
        let check = try TokenRelayProcess.runCommand(arguments: ["check", "--config", configURL.path], environment: environment)
        XCTAssertEqual(check.exitCode, 0, check.stderr)
        XCTAssertTrue(check.stdout.contains("(TLS)"), check.stdout)
        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                        environment: environment)
        XCTAssertEqual(imported.exitCode, 0, imported.stderr)
        XCTAssertTrue(imported.stdout.contains("version 1:"), imported.stdout)

        let relays = try (0..<2).map { index in
            try TokenRelayProcess.start(config: config, environment: environment, workDir: directory("tls-relay-\(index)"))
        }
        defer { relays.forEach { _ = $0.stop() } }
        for relay in relays {
            XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 }, relay.stderrText.suffix(2000).description)
        }
        tokenServer.expireAccessTokens()
        let ports = relays.map(\.proxyPort)
        let responses = burst(10) { index in
            try HTTPTestClient.send(port: ports[index % ports.count], method: "GET", path: "/tls-burst/\(index)")
        }
        XCTAssertEqual(statusCounts(responses), [200: 10])
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "exactly one refresh fleet-wide")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try redis.cli(["-a", password, "--no-auth-warning", "HGET", key, "version"]), "2")
        for relay in relays {
            XCTAssertEqual(try get(relay, "/after").status, 200)
            XCTAssertFalse(relay.stderrText.contains(password), "the Redis password in a log line")
            XCTAssertFalse(try admin(relay, "/status").bodyText.contains(password))
        }
        XCTAssertFalse(imported.stdout.contains(password) || imported.stderr.contains(password))
    }

    /// A `ca_file` that did not sign Redis' certificate: the relay says so in one line naming
    /// tokens.redis.tls and the cause, is not ready, never refreshes; `token import` fails the same way.
    func testWrongCAFailsWithOneLineNamingTheSetting() throws {
        let pki = try TestPKI.shared()
        try redis.cli(["CONFIG", "SET", "requirepass", password])
        defer { _ = try? redis.cli(["-a", password, "--no-auth-warning", "CONFIG", "SET", "requirepass", ""]) }
        let config = try tlsConfig(caFile: pki.otherCAFile)
        let configURL = workDir.appendingPathComponent("wrong-ca-config.json")
        try JSONSerialization.data(withJSONObject: config).write(to: configURL)

        let imported = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                        environment: environment)
        XCTAssertNotEqual(imported.exitCode, 0)
        let importLines = imported.stderr.split(separator: "\n").filter { $0.contains("tokens.redis.tls") }
        XCTAssertEqual(importLines.count, 1, imported.stderr)
        XCTAssertTrue(importLines.first?.contains("certificate verification failed") ?? false, imported.stderr)

        let relay = try TokenRelayProcess.start(config: config, environment: environment, workDir: directory("wrong-ca"))
        defer { _ = relay.stop() }
        let reason = "tokens.redis.tls: TLS handshake with 127.0.0.1:\(redis.tlsPort!) failed: certificate verification failed"
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains(reason) }, relay.stderrText.suffix(3000).description)
        let lines = relay.stderrText.split(separator: "\n").filter { $0.contains("tokens.redis.tls") }
        XCTAssertGreaterThanOrEqual(lines.count, 1)
        XCTAssertTrue(lines.allSatisfy { $0.contains(reason) }, lines.joined(separator: "\n"))
        XCTAssertTrue(try admin(relay, "/status").bodyText.contains("tokens.redis.tls"))
        XCTAssertEqual(try admin(relay, "/readyz").status, 503)
        XCTAssertEqual(tokenServer.refreshCalls, 0)
        XCTAssertFalse(relay.stderrText.contains(password))
    }
}
