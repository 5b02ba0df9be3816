import Foundation
import XCTest

/// Proactive refresh and expiry sources (issue #4), with 2-second tokens from a rotating token server.
final class ProactiveRefreshTests: RelayTestCase {
    override var accessTokenLifetime: Double? { 2 }

    /// Steady load through two-second tokens: clients never see a 401 and the server never sees reuse.
    func testSteadyLoadWithShortTokensShowsNoUnauthorized() throws {
        try skipUnlessSlowTestsEnabled("RefreshMachineTests.testProactiveRefreshRunsAheadOfExpiryWithoutHoldingRequests; end to end: JWTExpiryTests, ClientCredentialsProactiveTests")
        let tokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh, expiresAt: Date().addingTimeInterval(2))
        let relay = try startRelay()
        let duration = 20.0
        let path = tokenFileURL.path
        let stop = Locked(false)
        let badFileReads = Locked(0)
        let fileReader = AsyncCall<Void> {
            while !stop.withLock({ $0 }) {
                var info = stat()
                if let data = FileManager.default.contents(atPath: path) {
                    let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
                    let mode = stat(path, &info) == 0 ? Int(info.st_mode & 0o777) : 0o600
                    if object?["access_token"] == nil || mode != 0o600 { badFileReads.withLock { $0 += 1 } }
                }
                usleep(2_000)
            }
        }
        let deadline = Date().addingTimeInterval(duration)
        let results = HTTPTestClient.concurrently(4, timeout: duration + 30) { worker -> [Int: Int] in
            var counts: [Int: Int] = [:]
            var i = 0
            while Date() < deadline {
                let status = (try? HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/steady/\(worker)/\(i)").status) ?? -1
                counts[status, default: 0] += 1
                i += 1
            }
            return counts
        }
        stop.withLock { $0 = true }
        try fileReader.wait(timeout: 5)

        var total: [Int: Int] = [:]
        for case .success(let counts) in results { total.merge(counts, uniquingKeysWith: +) }
        XCTAssertEqual(total.keys.sorted(), [200], "every request must succeed: \(total)")
        XCTAssertGreaterThan(total[200] ?? 0, 100)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(badFileReads.withLock { $0 }, 0, "token file must always be whole and 0600")
        // 2-second tokens refreshed 1 s (half the lifetime, at most) before expiry: about one refresh per
        // second, never a storm.
        let refreshes = tokenServer.successfulRefreshes
        XCTAssertGreaterThanOrEqual(refreshes, Int(duration / 2) - 1)
        XCTAssertLessThanOrEqual(refreshes, Int(duration / 0.75) + 2)
        // The fake server invalidates the old access token at rotation, so requests in flight at that
        // moment get 401 and are replayed as stale; none of them may start a refresh.
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertFalse(metrics.contains("tokenrelay_refresh_cycles_total{trigger=\"unauthorized\"}"), metrics)
    }

    func testFileExpiresAtTriggersRefreshBeforeExpiry() throws {
        let tokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh, expiresAt: Date().addingTimeInterval(1.8))
        let relay = try startRelay()
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes >= 1 }, "refresh without any request")
        // The token server has rotated; until the relay has saved and adopted the answer a request would
        // still leave with the old token and meet a 401 that has nothing to do with proactive refresh.
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/status").bodyText.contains("\"generation\":2")) ?? false })
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(api.unauthorizedCount, 0)
    }

    func testExpiredAtStartIsRefreshedBeforeTheFirstRequest() throws {
        let tokens = tokenServer.issueInitialTokens()
        tokenServer.expireAccessTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh, expiresAt: Date().addingTimeInterval(-60))
        let relay = try startRelay()
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes == 1 })
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(api.unauthorizedCount, 0)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }

    func testProactiveRefreshDisabledFallsBackToUnauthorized() throws {
        let relay = try startRelay(["refresh": ["proactive": false]])
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { !self.tokenServer.isAccessTokenValid(self.tokenServer.currentAccessToken ?? "") })
        XCTAssertEqual(tokenServer.refreshCalls, 0)
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(api.unauthorizedCount, 1)
    }
}

/// Tokens that expire in one second, and tokens shorter-lived than the default skew.
final class ShortLifetimeTests: RelayTestCase {
    override var accessTokenLifetime: Double? { 1 }

    func testOneSecondTokensStayUsableWithoutATightLoop() throws {
        try skipUnlessSlowTestsEnabled("RefreshMachineTests.testTokensDueAtOnceAreRefreshedAtMostOncePerSecond; end to end: RefreshTokenSafetyTests.testZeroLifetimeDoesNotStartARefreshLoop")
        let relay = try startRelay()
        let deadline = Date().addingTimeInterval(4)
        var statuses: [Int: Int] = [:]
        while Date() < deadline { statuses[try get(relay).status, default: 0] += 1 }
        XCTAssertEqual(statuses.keys.sorted(), [200])
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        // Skew is at most half the lifetime: about two refreshes per second, not hundreds.
        XCTAssertLessThanOrEqual(tokenServer.refreshCalls, 12)
    }

    func testConfiguredSkewLongerThanTheLifetimeIsCappedAtHalf() throws {
        try skipUnlessSlowTestsEnabled("RefreshTriggerRuleTests.testSkewRules; end to end: RefreshTokenSafetyTests.testZeroLifetimeDoesNotStartARefreshLoop")
        let tokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh, expiresAt: Date().addingTimeInterval(1))
        let relay = try startRelay(["refresh": ["skew_seconds": 600]])
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.successfulRefreshes >= 2 })
        // 3 seconds of half-lifetime refreshes: about 6, certainly not a loop.
        let before = tokenServer.refreshCalls
        XCTAssertFalse(waitUntil(timeout: 3) { self.tokenServer.refreshCalls > before + 10 })
    }
}

/// A JWT access token without `expires_in`: its `exp` claim tells when to refresh.
final class JWTExpiryTests: RelayTestCase {
    override var accessTokenLifetime: Double? { nil }

    private static func jwt(expiresIn seconds: Double, serial: Int) -> String {
        func encode(_ object: [String: Any]) -> String {
            (try! JSONSerialization.data(withJSONObject: object)).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }
        let now = Date().timeIntervalSince1970
        return "\(encode(["alg": "none"])).\(encode(["exp": Int(now + seconds), "iat": Int(now), "n": serial])).sig"
    }

    func testJWTExpClaimDrivesProactiveRefresh() throws {
        let calls = Locked(0)
        let endpoint = try MiniHTTPServer { _ in
            let n = calls.withLock { $0 += 1; return $0 }
            return .json(200, ["access_token": Self.jwt(expiresIn: 2, serial: n), "refresh_token": "jwt-refresh-\(n)"])
        }
        defer { endpoint.stop() }
        try writeTokenFile(at: tokenFileURL, access: Self.jwt(expiresIn: 2, serial: 0), refresh: "jwt-refresh-0")
        let relay = try startRelay(["refresh": ["token_url": "\(endpoint.baseURL)/token"]])
        XCTAssertTrue(waitUntil(timeout: 6) { calls.withLock { $0 } >= 1 }, "exp of the stored JWT must schedule a refresh")
        XCTAssertTrue(waitUntil(timeout: 6) { calls.withLock { $0 } >= 2 }, "exp of the new JWT must schedule the next one")
        XCTAssertTrue(relay.isRunning)
    }

    func testWithoutAnyExpiryOnlyUnauthorizedRefreshes() throws {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertFalse(waitUntil(timeout: 1.5) { self.tokenServer.refreshCalls > 0 })
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }
}
