import Foundation
import XCTest
@testable import TokenRelay

/// Issue 14, items 4 and 6: after an unknown outcome the refresh token stays home until that exchange
/// cannot still be in progress at the server; a token endpoint's `Retry-After` is honoured.
final class RefreshHoldOffTests: RelayTestCase {
    /// The token endpoint answers only after the relay has given up on it (a late answer that rotates).
    func testNoRefreshTokenLeavesWhileALateAnswerMayStillComeAndTheStoredAnswerIsAdopted() throws {
        let relay = try startRelay(["timeouts": ["refresh_seconds": 0.5], "refresh": ["backoff_seconds": 1.0]])
        tokenServer.failureMode = .delay(1.5)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503, "timed out: outcome unknown")
        tokenServer.failureMode = .normal

        // The server is still working on the first exchange: a second presentation would be reuse.
        let during = try get(relay, "/during")
        XCTAssertEqual(during.status, 503)
        XCTAssertTrue(during.bodyText.contains("hold-off"), during.bodyText)
        XCTAssertGreaterThanOrEqual(Int(during.header("Retry-After") ?? "") ?? 0, 1)
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 503, "an operator cannot lift the hold-off")
        let readiness = try admin(relay, "/readyz")
        XCTAssertEqual(readiness.status, 503)
        XCTAssertTrue(readiness.bodyText.contains("outcome unknown"), readiness.bodyText)
        XCTAssertTrue(try admin(relay, "/status").bodyText.contains("\"refresh_hold_off\":\"refresh outcome unknown"))
        XCTAssertEqual(tokenServer.refreshCalls, 1)

        // The late answer rotated; another process (the one that got it) saved it: adopted, no reuse.
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes == 1 })
        let staged = workDir.appendingPathComponent("staged.json")
        try writeTokenFile(at: staged, access: try XCTUnwrap(tokenServer.currentAccessToken),
                           refresh: try XCTUnwrap(tokenServer.currentRefreshToken))
        XCTAssertEqual(rename(staged.path, tokenFileURL.path), 0)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.get(relay).status) == 200 })
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try admin(relay, "/readyz").status, 200)
    }

    /// A token endpoint that never answers the first exchange (tokenrelay times out and must close the
    /// connection) and loses the second one (reset before an answer); neither rotated. Each time the next
    /// presentation waits for refresh_seconds plus the backoff, doubled the second time, since the last
    /// one left, and never goes out while the previous connection is still open.
    func testAfterEachHoldOffTheNextNeedPresentsTheRefreshTokenOnceMore() throws {
        let sent = Locked<[Double]>([])
        let firstClosedAt = Locked<Double?>(nil)
        let server = tokenServer!
        let endpoint = try rawUpstream { connection in
            while try connection.readRequest() != nil {
                let count = sent.withLock { $0.append(ProcessInfo.processInfo.systemUptime); return $0.count }
                if count == 1 {
                    if connection.waitForPeerClose(timeout: 5) { firstClosedAt.withLock { $0 = ProcessInfo.processInfo.systemUptime } }
                    return
                }
                if count == 2 { return connection.resetOnClose() }
                let fresh = server.issueInitialTokens()
                let body = "{\"access_token\":\"\(fresh.access)\",\"refresh_token\":\"\(fresh.refresh)\",\"expires_in\":3600}"
                try connection.write("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)")
            }
        }
        let relay = try startRelay(["timeouts": ["refresh_seconds": 0.4],
                                    "refresh": ["token_url": endpoint.baseURL + "/oauth/token", "backoff_seconds": 0.3]])
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503, "timed out: outcome unknown")
        XCTAssertEqual(try get(relay, "/during").status, 503)
        XCTAssertEqual(sent.withLock { $0.count }, 1)

        func waitForTheHoldOffToEnd() {
            XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/status").bodyText.contains("\"refresh_hold_off\":null")) ?? false })
        }
        waitForTheHoldOffToEnd()
        XCTAssertEqual(try get(relay, "/second").status, 503, "connection lost: outcome unknown again")
        XCTAssertEqual(sent.withLock { $0.count }, 2)
        XCTAssertEqual(try get(relay, "/during-second").status, 503)
        waitForTheHoldOffToEnd()
        XCTAssertEqual(try get(relay, "/third").status, 200)

        let times = sent.withLock { $0 }
        XCTAssertEqual(times.count, 3)
        guard times.count == 3 else { return }
        let closed = try XCTUnwrap(firstClosedAt.withLock { $0 }, "tokenrelay closed the timed-out connection")
        XCTAssertLessThan(closed, times[1], "closed before the refresh token left again")
        XCTAssertGreaterThanOrEqual(times[1] - times[0], 0.4 + 0.3 - 0.02, "refresh_seconds plus backoff since the first one left")
        XCTAssertGreaterThanOrEqual(times[2] - times[1], 0.4 + 0.6 - 0.02, "the backoff doubled for the second unknown outcome")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    func testRetryAfterFromTheTokenEndpointSpacesRetriesAndHoldsOffTheNextCycle() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 2, "backoff_seconds": 0.05]])
        tokenServer.failureMode = .unavailable(status: 429, retryAfter: "1")
        tokenServer.expireAccessTokens()
        let started = Date()
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertEqual(tokenServer.refreshCalls, 2)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.9, "the retry waited for Retry-After, not the 0.05 s backoff")

        tokenServer.failureMode = .normal
        let next = Date()
        XCTAssertEqual(try get(relay, "/next").status, 200)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(next), 0.5, "the next cycle also waited for the last Retry-After")
        XCTAssertEqual(tokenServer.refreshCalls, 3)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}

/// Issue 14, item 5: rotated tokens that cannot be written keep being served, visibly, and are written
/// as soon as the disk allows; a shutdown that cannot save them says so and exits non-zero.
///
/// Tests run as root, so a read-only mode would not stop the write: the token file's directory is
/// removed instead (every write fails with ENOENT until it is back), which works anywhere. The relay is
/// configured with a symlink to the file (written through to its target): the in-flight refresh record
/// lives next to the configured path, which stays writable. Without it no refresh token leaves at all,
/// so nothing rotated could go unsaved.
final class UnsavedTokensTests: RelayTestCase {
    private var tokenDirectory: URL { workDir.appendingPathComponent("tokens-dir") }
    private var tokenPath: URL { tokenDirectory.appendingPathComponent("tokens.json") }
    private var linkPath: URL { workDir.appendingPathComponent("linked-tokens.json") }

    override func setUpWithError() throws {
        try super.setUpWithError()
        try FileManager.default.createDirectory(at: tokenDirectory, withIntermediateDirectories: true)
        XCTAssertEqual(rename(tokenFileURL.path, tokenPath.path), 0)
        try FileManager.default.createSymbolicLink(atPath: linkPath.path, withDestinationPath: tokenPath.path)
    }

    private func startRelayLosingItsTokenDirectory(backoff: Double) throws -> TokenRelayProcess {
        let relay = try startRelay(["tokens": ["file": linkPath.path], "refresh": ["backoff_seconds": backoff]])
        try FileManager.default.removeItem(at: tokenDirectory)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200, "serving with the rotated tokens beats failing")
        XCTAssertTrue(relay.stderrText.contains("could not persist"), relay.stderrText)
        return relay
    }

    private func savedRefreshToken() -> String? {
        guard let data = FileManager.default.contents(atPath: tokenPath.path) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data) as? [String: Any])?["refresh_token"] as? String
    }

    func testUnsavedTokensAreVisibleAndWrittenOnceTheDirectoryIsBack() throws {
        let relay = try startRelayLosingItsTokenDirectory(backoff: 0.05)
        let status = try admin(relay, "/status").bodyText
        XCTAssertTrue(status.contains("\"unsaved_tokens\":true"), status)
        XCTAssertTrue(status.contains("rotated tokens are not saved"), status)
        XCTAssertTrue(try admin(relay, "/metrics").bodyText.contains("tokenrelay_unsaved_tokens 1"))
        XCTAssertEqual(try admin(relay, "/readyz").status, 200, "the tokens in service work")

        try FileManager.default.createDirectory(at: tokenDirectory, withIntermediateDirectories: true)
        XCTAssertTrue(waitUntil(timeout: 10) { self.savedRefreshToken() == self.tokenServer.currentRefreshToken },
                      "the write is retried until it succeeds")
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/status").bodyText.contains("\"unsaved_tokens\":false")) ?? false })
        XCTAssertTrue(try admin(relay, "/metrics").bodyText.contains("tokenrelay_unsaved_tokens 0"))
        XCTAssertEqual(relay.stop(), 0)
    }

    func testShutdownMakesALastAttemptToSave() throws {
        // A long backoff: no retry runs before the signal, so only the attempt at exit can save.
        let relay = try startRelayLosingItsTokenDirectory(backoff: 30)
        try FileManager.default.createDirectory(at: tokenDirectory, withIntermediateDirectories: true)
        relay.signal(SIGTERM)
        XCTAssertEqual(relay.waitForExit(timeout: 10), 0)
        XCTAssertEqual(savedRefreshToken(), tokenServer.currentRefreshToken)
    }

    func testShutdownThatCannotSaveExitsNonZeroWithOneLine() throws {
        let relay = try startRelayLosingItsTokenDirectory(backoff: 0.05)
        relay.signal(SIGTERM)
        let code = relay.waitForExit(timeout: 10)
        XCTAssertNotNil(code)
        XCTAssertNotEqual(code, 0)
        let lines = relay.stderrText.split(separator: "\n").filter { $0.hasPrefix("tokenrelay: ") }
        XCTAssertEqual(lines.count, 1, relay.stderrText)
        XCTAssertTrue(lines.first?.contains("rotated tokens that could not be saved") ?? false, relay.stderrText)
    }

    /// A full filesystem (a 64 KiB tmpfs filled up), where the sandbox lets us mount one.
    func testFullFilesystemIsRetriedOnceThereIsSpace() throws {
        let mountPoint = workDir.appendingPathComponent("small-fs")
        try FileManager.default.createDirectory(at: mountPoint, withIntermediateDirectories: true)
        guard run("/bin/mount", ["-t", "tmpfs", "-o", "size=64k", "tmpfs", mountPoint.path]) == 0 else {
            throw XCTSkip("cannot mount a tmpfs here")
        }
        defer { _ = run("/bin/umount", ["-l", mountPoint.path]) }
        let path = mountPoint.appendingPathComponent("tokens.json")
        try FileManager.default.copyItem(at: tokenPath, to: path)  // another filesystem: no rename
        chmod(path.path, 0o600)
        let link = workDir.appendingPathComponent("tmpfs-tokens.json")  // the in-flight record goes here, with room
        try FileManager.default.createSymbolicLink(atPath: link.path, withDestinationPath: path.path)
        let relay = try startRelay(["tokens": ["file": link.path], "refresh": ["backoff_seconds": 0.05]])
        let filler = mountPoint.appendingPathComponent("filler")
        _ = run("/bin/dd", ["if=/dev/zero", "of=\(filler.path)", "bs=4k", "count=64"])  // fails at ENOSPC, as intended
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertTrue(try admin(relay, "/status").bodyText.contains("\"unsaved_tokens\":true"))
        try FileManager.default.removeItem(at: filler)
        XCTAssertTrue(waitUntil(timeout: 10) {
            guard let data = FileManager.default.contents(atPath: path.path) else { return false }
            return (try? JSONSerialization.jsonObject(with: data) as? [String: Any])?["refresh_token"] as? String == self.tokenServer.currentRefreshToken
        })
        XCTAssertEqual(relay.stop(), 0)
    }

    private func run(_ tool: String, _ arguments: [String]) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }
}

/// Issue 14, item 7: a symlinked token file is written through to its target, atomically, in the
/// target's directory; the link stays a link.
final class SymlinkedTokenFileTests: RelayTestCase {
    func testSymlinkedTokenFileIsWrittenThroughToItsTarget() throws {
        let targetDirectory = workDir.appendingPathComponent("real")
        try FileManager.default.createDirectory(at: targetDirectory, withIntermediateDirectories: true)
        let target = targetDirectory.appendingPathComponent("tokens.json")
        XCTAssertEqual(rename(tokenFileURL.path, target.path), 0)
        let link = workDir.appendingPathComponent("linked.json")
        try FileManager.default.createSymbolicLink(atPath: link.path, withDestinationPath: "real/tokens.json")

        let relay = try startRelay(["tokens": ["file": link.path]])
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)

        XCTAssertEqual(try FileManager.default.destinationOfSymbolicLink(atPath: link.path), "real/tokens.json", "the link stays a link")
        let saved = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: target)) as? [String: Any])
        XCTAssertEqual(saved["refresh_token"] as? String, tokenServer.currentRefreshToken)
        XCTAssertEqual(try fileMode(target), 0o600)
        for directory in [workDir!, targetDirectory] {
            let strays = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasPrefix(".") }
            XCTAssertEqual(strays, [], directory.path)
        }
        // A restart reads the target through the link and needs no refresh.
        XCTAssertEqual(relay.stop(), 0)
        let restarted = try startRelay(["tokens": ["file": link.path]])
        XCTAssertEqual(try get(restarted).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }
}

final class RetryAfterTests: XCTestCase {
    func testDelaySecondsAndDatesAreClampedAtTheEdge() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        XCTAssertEqual(RetryAfter.seconds(from: "2", now: now), 2)
        XCTAssertEqual(RetryAfter.seconds(from: " 0 ", now: now), 0)
        XCTAssertEqual(RetryAfter.seconds(from: "99999999999999999999999999", now: now), RetryAfter.maximumSeconds)
        XCTAssertNil(RetryAfter.seconds(from: "-1", now: now))
        XCTAssertNil(RetryAfter.seconds(from: "soon", now: now))
        XCTAssertNil(RetryAfter.seconds(from: nil, now: now))
        XCTAssertEqual(RetryAfter.seconds(from: "Thu, 14 Jan 2027 08:00:30 GMT", now: Date(timeIntervalSince1970: 1_799_913_600)), 30)
        XCTAssertEqual(RetryAfter.seconds(from: "Thu, 14 Jan 2027 07:00:00 GMT", now: Date(timeIntervalSince1970: 1_799_913_600)), 0,
                       "a date in the past means now")
    }
}
