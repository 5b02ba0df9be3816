import Foundation
import XCTest
@testable import TokenRelay

/// End to end: a run killed after the token endpoint answered a rotation and the new state was written to
/// its complete temporary file, but before the rename. The next start puts that answer in place instead of
/// presenting the burnt refresh token (reuse at a rotating server: login required).
final class LeftoverTokenFileRecoveryTests: RelayTestCase {
    /// What a run killed after its rotation's answer was written, before the rename, leaves behind: the
    /// in-flight record naming the token file's refresh token, the server holding the rotated set, and the
    /// complete temporary file of a writer that is gone. Returns (burnt, rotated access, rotated refresh, file).
    private func leaveAKilledRunsRotation() throws -> (String, String, String, URL) {
        let burnt = try XCTUnwrap(readTokenFile()["refresh_token"] as? String)
        try RefreshInFlightMarker(tokenFilePath: tokenFileURL.path).writer(for: RefreshInFlightRecord(refreshToken: burnt, sentAt: Date()))()
        let body = FakeTokenServer.formEncode([("grant_type", "refresh_token"), ("refresh_token", burnt)])
        let answer = try HTTPTestClient.send(port: tokenServer.port, method: "POST", path: FakeTokenServer.tokenPath,
                                             headers: [("Authorization", FakeTokenServer.basicAuthorization(id: "legacy-app", secret: Self.clientSecret)),
                                                       ("Content-Type", "application/x-www-form-urlencoded")],
                                             body: Data(body.utf8))
        XCTAssertEqual(answer.status, 200, answer.bodyText)
        let rotatedAccess = try XCTUnwrap(answer.json()?["access_token"] as? String)
        let rotatedRefresh = try XCTUnwrap(answer.json()?["refresh_token"] as? String)
        let leftover = workDir.appendingPathComponent(".tokens.json.tmp-2000000000-77")
        try writeTokenFile(at: leftover, access: rotatedAccess, refresh: rotatedRefresh, expiresAt: Date(timeIntervalSinceNow: 3600))
        return (burnt, rotatedAccess, rotatedRefresh, leftover)
    }

    /// A relay sharing the token file with the killed one: it finds the leftover when it takes the lock
    /// for its own refresh (after a 401), and uses the answer instead of holding off and presenting the
    /// burnt refresh token.
    func testARunningRelayTakesTheRotationAKilledSharerSavedWhenItTakesTheLock() throws {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 200)
        let (burnt, rotatedAccess, rotatedRefresh, leftover) = try leaveAKilledRunsRotation()
        let response = try get(relay, "/after")  // the old access token is revoked with the rotation: 401, lock, read
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(tokenServer.refreshCalls, 1, "only the killed run's refresh")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try readTokenFile()["refresh_token"] as? String, rotatedRefresh)
        XCTAssertFalse(FileManager.default.fileExists(atPath: leftover.path))
        XCTAssertFalse(FileManager.default.fileExists(atPath: RefreshInFlightMarker.path(forTokenFile: tokenFileURL.path)))
        let log = relay.stderrText
        XCTAssertTrue(log.contains("recovered the token set a previous run wrote but did not put in place"), log)
        for secret in [burnt, rotatedAccess, rotatedRefresh] { XCTAssertFalse(log.contains(secret), "no token in the log") }
        XCTAssertEqual(relay.stop(), 0)
    }

    func testAStartPutsTheRotationAKilledRunSavedInPlaceAndPresentsNothing() throws {
        let (burnt, rotatedAccess, rotatedRefresh, leftover) = try leaveAKilledRunsRotation()
        let stray = workDir.appendingPathComponent(".tokens.json.tmp-2000000001-78")
        try Data("{\"access_token\": \"trunc".utf8).write(to: stray)

        let relay = try startRelay()
        let response = try get(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(tokenServer.refreshCalls, 1, "only the killed run's refresh: nothing presented at start")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try readTokenFile()["refresh_token"] as? String, rotatedRefresh)
        XCTAssertEqual(try fileMode(tokenFileURL), 0o600)
        XCTAssertFalse(FileManager.default.fileExists(atPath: leftover.path))
        XCTAssertFalse(FileManager.default.fileExists(atPath: stray.path))
        XCTAssertFalse(FileManager.default.fileExists(atPath: RefreshInFlightMarker.path(forTokenFile: tokenFileURL.path)))
        let log = relay.stderrText
        XCTAssertTrue(log.contains("recovered the token set a previous run wrote but did not put in place"), log)
        XCTAssertTrue(log.contains("removed a temporary token file a previous run left"), log)
        for secret in [burnt, rotatedAccess, rotatedRefresh] { XCTAssertFalse(log.contains(secret), "no token in the log") }
        XCTAssertEqual(relay.stop(), 0)
    }
}
