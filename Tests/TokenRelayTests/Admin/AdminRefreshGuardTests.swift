import Foundation
import XCTest

/// `POST /refresh` used to rotate the refresh token once per call (30 calls, 30 rotations). Calls made
/// while a refresh runs join it; calls within a few seconds after one get its result.
final class AdminRefreshGuardTests: RelayTestCase {
    func testThirtyForcedRefreshesRotateAtMostTwice() throws {
        let relay = try startRelay()
        let together = burst(15) { _ in try HTTPTestClient.send(port: relay.adminPort, method: "POST", path: "/refresh") }
        XCTAssertEqual(together.map(\.status), Array(repeating: 200, count: 15))
        for _ in 0..<15 {
            XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        }
        XCTAssertGreaterThanOrEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertLessThanOrEqual(tokenServer.successfulRefreshes, 2, "30 calls, at most a couple of rotations")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// `admin.token_file`: POST /refresh and /status need the bearer token (compared in constant time);
    /// /healthz, /readyz and /metrics stay open for probes and scrapers; the token is never logged.
    func testAdminTokenProtectsRefreshAndStatusOnly() throws {
        let token = "admin-\(UUID().uuidString)"
        let tokenFile = workDir.appendingPathComponent("admin-token")
        try Data((token + "\n").utf8).write(to: tokenFile)
        let relay = try startRelay(["admin": ["listen": "127.0.0.1:0", "token_file": tokenFile.path]])
        let port = relay.adminPort
        func call(_ method: String, _ path: String, _ authorization: String?) throws -> Int {
            try HTTPTestClient.send(port: port, method: method, path: path, headers: authorization.map { [("Authorization", $0)] } ?? []).status
        }
        XCTAssertEqual(try call("GET", "/status", nil), 401)
        XCTAssertEqual(try call("GET", "/status", "Bearer wrong"), 401)
        XCTAssertEqual(try call("GET", "/status", "Bearer \(token)x"), 401, "a longer token is not the token")
        XCTAssertEqual(try call("GET", "/status", "Basic \(token)"), 401)
        XCTAssertEqual(try call("POST", "/refresh", nil), 401)
        XCTAssertEqual(try call("POST", "/refresh", "Bearer \(String(token.dropLast()))"), 401)
        XCTAssertEqual(tokenServer.refreshCalls, 0, "an unauthorised POST /refresh starts nothing")
        let refused = try HTTPTestClient.send(port: port, method: "GET", path: "/status")
        XCTAssertEqual(refused.headers.first { $0.0.lowercased() == "www-authenticate" }?.1, "Bearer realm=\"tokenrelay-admin\"")

        XCTAssertEqual(try call("GET", "/status", "Bearer \(token)"), 200)
        XCTAssertEqual(try call("POST", "/refresh", "bearer \(token)"), 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        for path in ["/healthz", "/readyz", "/metrics"] {
            XCTAssertEqual(try call("GET", path, nil), 200, "\(path) stays open")
        }
        XCTAssertFalse(relay.stderrText.contains(token), "the admin token is never logged")
        XCTAssertFalse(try HTTPTestClient.send(port: port, method: "GET", path: "/metrics").bodyText.contains(token))
    }

    /// A rotated `admin.token_file` (written aside and renamed over, as a Secret update does) is taken up
    /// without a restart; a changed file that cannot be used keeps the token in use, with one line.
    func testARotatedAdminTokenFileIsTakenUpWithoutARestart() throws {
        let (first, second) = ("admin-\(UUID().uuidString)", "admin-\(UUID().uuidString)")
        let tokenFile = workDir.appendingPathComponent("admin-token")
        func replace(with text: String) throws {
            let aside = workDir.appendingPathComponent("admin-token.new")
            try Data(text.utf8).write(to: aside)
            XCTAssertEqual(rename(aside.path, tokenFile.path), 0)
        }
        try replace(with: first + "\n")
        let relay = try startRelay(["admin": ["listen": "127.0.0.1:0", "token_file": tokenFile.path],
                                    "tokens": ["watch_interval_seconds": 0.2]])
        func status(_ token: String) -> Int {
            (try? HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/status", headers: [("Authorization", "Bearer \(token)")]).status) ?? -1
        }
        XCTAssertEqual(status(first), 200)
        try replace(with: second + "\n")
        XCTAssertTrue(waitUntil(timeout: 10) { status(second) == 200 }, relay.stderrText)
        XCTAssertEqual(status(first), 401, "the rotated-out token no longer opens /status")

        try replace(with: "\n")
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("ignoring changed admin token file") }, relay.stderrText)
        XCTAssertTrue(relay.stderrText.contains("admin.token_file"), "the line names the field")
        XCTAssertEqual(status(second), 200, "an empty file keeps the token in use")
        XCTAssertFalse(relay.stderrText.contains(first) || relay.stderrText.contains(second), "admin tokens are never logged")
    }

    func testAnUnreadableAdminTokenFileIsOneLineNamingTheField() throws {
        XCTAssertThrowsError(try startRelay(["admin": ["listen": "127.0.0.1:0", "token_file": workDir.appendingPathComponent("missing").path]],
                                            startupTimeout: 5)) { error in
            XCTAssertTrue("\(error)".contains("admin.token_file"), "\(error)")
        }
    }
}
