import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// The lock holder SIGKILLed before its refresh request leaves: a real kill of a real relay, not a lock
/// key planted by the test. The victim's token endpoint is a listener that never accepts and whose one
/// queue slot is taken, so its connect hangs in SYN-SENT: whatever the timing of the kill, not one byte
/// of the victim's refresh request can reach any token server, and the refresh token it read under the
/// lock stays unburnt.
final class FleetKilledHolderTests: RelayTestCase {
    private var redis: RedisServerProcess!
    private let key = "tokenrelay:fleet-killed-holder"

    override func setUpWithError() throws {
        try super.setUpWithError()
        redis = try RedisServerProcess()
    }

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        redis?.stop()
        redis = nil
    }

    func testLockHolderKilledBeforeItsRequestLeavesIsTakenOverAfterTheLockExpires() throws {
        let blackHole = try rawUpstream(backlog: 0, accepting: false) { _ in }
        let filler = try LoopbackSocket.connect(port: blackHole.port, timeout: 2)
        defer { close(filler) }
        try importTokens()
        let victim = try startReadyRelay(tokenURL: blackHole.baseURL + FakeTokenServer.tokenPath)
        let survivors = try (0..<2).map { _ in try startReadyRelay(tokenURL: tokenServer.tokenURL) }

        tokenServer.expireAccessTokens()
        let victimRequest = HTTPTestClient.concurrentlyAsync {
            try HTTPTestClient.send(port: victim.proxyPort, method: "GET", path: "/victim")
        }
        // The victim holds the lock (its pid is in the owner id) and is connecting to the black hole.
        let ownerMark = "/\(victim.pid)/"
        XCTAssertTrue(waitUntil(timeout: 10) { ((try? self.redis.cli(["GET", self.lockKey])) ?? "").contains(ownerMark) },
                      "the victim took the lock: \(victim.stderrText.suffix(2000))")
        kill(victim.pid, SIGKILL)
        XCTAssertNotNil(victim.waitForExit(timeout: 5), "the victim died")
        _ = try? victimRequest.wait(timeout: 5)
        XCTAssertEqual(tokenServer.refreshCalls, 0, "nothing reached the token server from the victim")
        let remaining = Int(try redis.cli(["PTTL", lockKey])) ?? -2
        XCTAssertGreaterThan(remaining, 0, "the dead holder's lock is still there, with an expiry")

        let ports = survivors.map(\.proxyPort)
        let held = HTTPTestClient.concurrentlyAsync {
            HTTPTestClient.concurrently(12) { index in
                try HTTPTestClient.send(port: ports[index % ports.count], method: "GET", path: "/held/\(index)", timeout: 20)
            }.map { result -> String in
                switch result {
                case .success(let response): return String(response.status)
                case .failure(let error): return "\(error)"
                }
            }
        }
        // While the dead holder's lock exists, nobody refreshes. The count is read before the lock: if the
        // lock is still the victim's afterwards, the count was taken while it held.
        var pollsWhileHeld = 0
        let expired = waitUntil(timeout: 10, interval: 0.02) {
            let calls = self.tokenServer.refreshCalls
            guard ((try? self.redis.cli(["GET", self.lockKey])) ?? "").contains(ownerMark) else { return true }
            XCTAssertEqual(calls, 0, "a relay refreshed while the dead holder's lock was still in Redis")
            pollsWhileHeld += 1
            return false
        }
        XCTAssertTrue(expired, "the dead holder's lock expired")
        XCTAssertGreaterThan(pollsWhileHeld, 0, "the lock was watched while it held")

        let outcomes = try held.wait(timeout: 30)
        XCTAssertEqual(Dictionary(grouping: outcomes, by: { $0 }).mapValues(\.count), ["200": 12],
                       "every held request on the survivors answered 200")
        XCTAssertEqual(tokenServer.refreshCalls, 1, "exactly one refresh, by a survivor")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try redis.cli(["HGET", key, "version"]), "2")
        XCTAssertEqual(blackHole.acceptedConnections, 0)
    }

    // MARK: - Helpers

    private var lockKey: String { key + ":lock" }

    private func fleetConfig(tokenURL: String) -> [String: Any] {
        var config = config(["timeouts": ["refresh_seconds": 2, "hold_seconds": 15]])
        var refresh = config["refresh"] as? [String: Any] ?? [:]
        refresh["token_url"] = tokenURL
        config["refresh"] = refresh
        config["tokens"] = ["redis": ["url": redis.url, "key": key, "command_timeout_seconds": 0.5,
                                      "poll_interval_seconds": 0.1, "lock_seconds": 3.5] as [String: Any],
                            "file": NSNull(), "watch_interval_seconds": 0.2] as [String: Any]
        return config
    }

    private func startReadyRelay(tokenURL: String) throws -> TokenRelayProcess {
        let relay = try startRelay(fleetConfig(tokenURL: tokenURL))
        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.admin(relay, "/readyz").status) == 200 },
                      "relay not ready: \(relay.stderrText.suffix(2000))")
        return relay
    }

    private func importTokens() throws {
        let configURL = workDir.appendingPathComponent("import-config.json")
        try JSONSerialization.data(withJSONObject: fleetConfig(tokenURL: tokenServer.tokenURL)).write(to: configURL)
        let result = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
    }
}
