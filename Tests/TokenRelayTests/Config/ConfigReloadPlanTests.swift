import Foundation
import XCTest
@testable import TokenRelay

/// Which changes a reload applies and which wait for a restart (pure: no process, no loop).
final class ConfigReloadPlanTests: XCTestCase {
    private func config(_ edit: (inout [String: Any]) -> Void = { _ in }) throws -> Config {
        var object: [String: Any] = [
            "listen": "127.0.0.1:8080",
            "upstream": ["url": "http://127.0.0.1:9000"],
            "tokens": ["file": "/var/lib/tokenrelay/tokens.json"],
            "refresh": ["grant": "refresh_token", "token_url": "http://127.0.0.1:9001/oauth/token", "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic"],
            "admin": ["listen": "127.0.0.1:8081"],
        ]
        edit(&object)
        return try ConfigLoader.parse(JSONSerialization.data(withJSONObject: object))
    }

    func testLiveSettingsApplyWithNothingDeferred() throws {
        let loaded = try config {
            $0["upstream"] = ["url": "https://api.example.com/v2"]
            $0["timeouts"] = ["upstream_seconds": 5, "hold_seconds": 3]
            $0["limits"] = ["max_held_requests": 7, "max_client_connections": 9]
            $0["inject"] = ["header": "X-Api-Token", "format": "{token}"]
            $0["log"] = ["level": "warning"]
            var refresh = $0["refresh"] as! [String: Any]
            refresh["client_id"] = "other-app"
            refresh["max_attempts"] = 2
            $0["refresh"] = refresh
        }
        let plan = ConfigReload(running: try config(), loaded: loaded)
        XCTAssertEqual(plan.needsRestart, [])
        XCTAssertEqual(plan.effective.upstream.url.authority, "api.example.com")
        XCTAssertEqual(plan.effective.timeouts.holdSeconds, 3)
        XCTAssertEqual(plan.effective.limits.maxClientConnections, 9)
        XCTAssertEqual(plan.effective.inject.header, "X-Api-Token")
        XCTAssertEqual(plan.effective.logLevel, "warning")
        XCTAssertEqual(plan.effective.refresh.clientID, "other-app")
        XCTAssertEqual(plan.effective.refresh.maxAttempts, 2)
    }

    func testRestartOnlySettingsKeepTheirRunningValueAndAreNamed() throws {
        let loaded = try config {
            $0["listen"] = "127.0.0.1:9090"
            $0["admin"] = ["listen": "127.0.0.1:9091"]
            $0["tokens"] = ["file": "/elsewhere/tokens.json", "watch_interval_seconds": 5]
            $0["log"] = ["format": "json"]
            $0["upstream"] = ["url": "http://127.0.0.1:9500"]
        }
        let plan = ConfigReload(running: try config(), loaded: loaded)
        XCTAssertEqual(plan.needsRestart.map(\.field), ["listen", "admin.listen", "tokens.file", "tokens.watch_interval_seconds", "log.format"])
        XCTAssertEqual(plan.needsRestart.first?.description,
                       "listen: changing it needs a restart (running 127.0.0.1:8080, config file says 127.0.0.1:9090)")
        XCTAssertEqual(plan.effective.listen.port, 8080)
        XCTAssertEqual(plan.effective.admin?.listen.port, 8081)
        XCTAssertEqual(plan.effective.tokens.file, "/var/lib/tokenrelay/tokens.json")
        XCTAssertEqual(plan.effective.tokens.watchIntervalSeconds, 1)
        XCTAssertEqual(plan.effective.logFormat, .text)
        XCTAssertEqual(plan.effective.upstream.url.port, 9500, "the rest of the reload still applies")
    }

    private func fleet(_ redis: [String: Any], refreshSeconds: Double = 60) -> (inout [String: Any]) -> Void {
        { object in
            var settings: [String: Any] = ["url": "redis://127.0.0.1:6379/0", "key": "tokenrelay:app"]
            settings.merge(redis) { _, new in new }
            object["tokens"] = ["redis": settings]
            object["timeouts"] = ["refresh_seconds": refreshSeconds]
        }
    }

    /// The lock's life follows the reload (the next lock taken uses it); the connection settings of the
    /// Redis store need a restart, and are named.
    func testRedisLockSecondsApplyLiveAndConnectionSettingsNeedARestart() throws {
        let running = try config(fleet(["lock_seconds": 70]))
        let longer = ConfigReload(running: running, loaded: try config(fleet(["lock_seconds": 100], refreshSeconds: 90)))
        XCTAssertEqual(longer.needsRestart, [])
        XCTAssertEqual(longer.effective.tokens.redis?.lockSeconds, 100)
        XCTAssertNoThrow(try longer.validate())

        let derived = ConfigReload(running: running, loaded: try config(fleet([:], refreshSeconds: 90)))
        XCTAssertEqual(derived.effective.tokens.redis?.effectiveLockSeconds(refreshSeconds: derived.effective.timeouts.refreshSeconds), 100,
                       "without lock_seconds the life derives from the reloaded refresh_seconds (90 + 5 × 2)")

        let moved = ConfigReload(running: running, loaded: try config(fleet(["lock_seconds": 80, "command_timeout_seconds": 1,
                                                                              "url": "redis://10.0.0.2:6379/0"])))
        XCTAssertEqual(moved.needsRestart.map(\.field), ["tokens.redis"])
        let line = moved.needsRestart.first?.description ?? ""
        XCTAssertTrue(line.contains("running 127.0.0.1:6379/0 key tokenrelay:app username none no password command_timeout_seconds 2"), line)
        XCTAssertTrue(line.contains("config file says 10.0.0.2:6379/0 key"), line)
        XCTAssertEqual(moved.effective.tokens.redis?.url, "127.0.0.1:6379/0")
        XCTAssertEqual(moved.effective.tokens.redis?.commandTimeoutSeconds, 2)
        XCTAssertEqual(moved.effective.tokens.redis?.lockSeconds, 80, "lock_seconds applies even when the rest waits")
    }

    /// A lock_seconds that is valid with the new command timeout but too short with the running one
    /// (which waits for a restart) is refused with the field named.
    func testReloadedLockTooShortForTheRunningCommandTimeoutIsRefused() throws {
        let running = try config(fleet(["command_timeout_seconds": 5, "lock_seconds": 80]))
        let plan = ConfigReload(running: running, loaded: try config(fleet(["command_timeout_seconds": 1, "lock_seconds": 62])))
        XCTAssertEqual(plan.needsRestart.map(\.field), ["tokens.redis"])
        XCTAssertThrowsError(try plan.validate()) { error in
            XCTAssertTrue("\(error)".hasPrefix("tokens.redis.lock_seconds: must be at least"), "\(error)")
        }
    }

    func testRemovingTheAdminListenerNeedsARestart() throws {
        let plan = ConfigReload(running: try config(), loaded: try config { $0.removeValue(forKey: "admin") })
        XCTAssertEqual(plan.needsRestart, [.init(field: "admin.listen", running: "127.0.0.1:8081", requested: "none")])
        XCTAssertNotNil(plan.effective.admin)
    }

    /// tokens.encryption: switching sealing on or off waits for a restart; another key file applies live.
    func testSealingOnOrOffNeedsARestartAndAnotherKeyApplies() throws {
        func sealed(_ keyFile: String) -> (inout [String: Any]) -> Void {
            { $0["tokens"] = ["file": "/var/lib/tokenrelay/tokens.json", "encryption": ["key_file": keyFile]] }
        }
        let on = ConfigReload(running: try config(), loaded: try config(sealed("/k1")))
        XCTAssertEqual(on.needsRestart.map(\.field), ["tokens.encryption"])
        XCTAssertNil(on.effective.tokens.encryption)
        let off = ConfigReload(running: try config(sealed("/k1")), loaded: try config())
        XCTAssertEqual(off.needsRestart.map(\.field), ["tokens.encryption"])
        XCTAssertEqual(off.effective.tokens.encryption?.key, .file("/k1"))
        let rotated = ConfigReload(running: try config(sealed("/k1")), loaded: try config(sealed("/k2")))
        XCTAssertEqual(rotated.needsRestart, [])
        XCTAssertEqual(rotated.effective.tokens.encryption?.key, .file("/k2"))
    }
}
