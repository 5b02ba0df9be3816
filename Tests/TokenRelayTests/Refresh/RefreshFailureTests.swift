import Foundation
import XCTest

final class RefreshFailureTests: RelayTestCase {
    func testRejectedRefreshLatchesLoginRequiredWithoutAStorm() throws {
        let relay = try startRelay()
        XCTAssertEqual(try admin(relay, "/readyz").status, 200)
        tokenServer.failureMode = .rejectAll
        tokenServer.expireAccessTokens()

        let responses = burst(20) { i in try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/burst/\(i)") }

        XCTAssertEqual(statusCounts(responses), [401: 20])
        XCTAssertEqual(tokenServer.refreshCalls, 1, "a burst must cause at most one refresh attempt")
        // Requests that reached the upstream get the upstream's own 401 back.
        let upstreamAnswered = responses.filter { $0.bodyText.contains("invalid_token") && !$0.bodyText.contains("login_required") }
        XCTAssertFalse(upstreamAnswered.isEmpty)
        for response in upstreamAnswered { XCTAssertEqual(response.header("WWW-Authenticate"), "Bearer error=\"invalid_token\"") }
        let readiness = try admin(relay, "/readyz")
        XCTAssertEqual(readiness.status, 503)
        XCTAssertTrue(readiness.bodyText.contains("login"), readiness.bodyText)

        // Latched: answered locally, nothing sent upstream, no new refresh.
        let upstreamBefore = api.requestCount
        let later = try get(relay, "/later")
        XCTAssertEqual(later.status, 401)
        XCTAssertTrue(later.bodyText.contains("login_required"), later.bodyText)
        XCTAssertEqual(api.requestCount, upstreamBefore)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertTrue(try admin(relay, "/status").bodyText.contains("login_required"))
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_refresh_errors_total{error=\"invalid_grant\"} 1"), metrics)
        XCTAssertTrue(metrics.contains("tokenrelay_refresh_duration_seconds_count 1"), metrics)
    }

    func testNewTokenFileClearsTheLatch() throws {
        let relay = try startRelay()
        try latchLoginRequired(relay)

        // An operator logs in again and writes fresh tokens.
        tokenServer.failureMode = .normal
        let fresh = tokenServer.issueInitialTokens()
        let staged = workDir.appendingPathComponent("staged.json")
        try writeTokenFile(at: staged, access: fresh.access, refresh: fresh.refresh)
        XCTAssertEqual(rename(staged.path, tokenFileURL.path), 0)

        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.admin(relay, "/readyz").status) == 200 })
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
    }

    func testForcedRefreshThroughAdmin() throws {
        let relay = try startRelay()
        let response = try admin(relay, "/refresh", method: "POST")
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(try readTokenFile()["refresh_token"] as? String, tokenServer.currentRefreshToken)
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testTransientFailuresAreRetriedThenAnswered503() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 3, "backoff_seconds": 0.05]])
        tokenServer.failureMode = .unavailable(status: 503)
        tokenServer.expireAccessTokens()

        let response = try get(relay)

        XCTAssertEqual(response.status, 503)
        XCTAssertNotNil(response.header("Retry-After"))
        XCTAssertEqual(tokenServer.refreshCalls, 3)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        // Not a login problem, but the rejected token is dead and no new one came: not ready (ReadinessTests).
        let status = try admin(relay, "/status").bodyText
        XCTAssertTrue(status.contains("\"state\":\"ready\""), "a transient failure is not a login problem: \(status)")

        // Once the token endpoint is back, the next 401 refreshes normally.
        tokenServer.failureMode = .normal
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testTransientFailureThenRecoveryReleasesHeldRequests() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 5, "backoff_seconds": 0.2]])
        tokenServer.failureMode = .unavailable(status: 502)
        tokenServer.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/held") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls >= 1 })
        tokenServer.failureMode = .normal
        XCTAssertEqual(try held.wait(timeout: 10).status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
    }

    func testHoldTimeoutAnswers503() throws {
        let relay = try startRelay(["timeouts": ["hold_seconds": 0.5], "refresh": ["max_attempts": 20, "backoff_seconds": 0.2]])
        tokenServer.failureMode = .unavailable(status: 503)
        tokenServer.expireAccessTokens()
        let started = Date()
        let response = try get(relay)
        XCTAssertEqual(response.status, 503)
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
    }

    func testUnreachableTokenEndpointIsTransient() throws {
        tokenServer.stop()
        let relay = try startRelay(["refresh": ["max_attempts": 2, "backoff_seconds": 0.05]])
        api.forceUnauthorizedOnce(path: "/resource")
        let response = try get(relay)
        XCTAssertEqual(response.status, 503)
        XCTAssertTrue(relay.stderrText.contains("could not connect"), relay.stderrText)
    }

    func testTokenWithControlCharactersIsNeverInjected() throws {
        // A token endpoint answering with a CR/LF in the token is a failure, not a header injection.
        let evil = try MiniHTTPServer { _ in
            TestResponse.json(200, ["access_token": "evil\r\nX-Injected: yes", "refresh_token": "r2", "expires_in": 60])
        }
        defer { evil.stop() }
        let relay = try startRelay(["refresh": ["token_url": "\(evil.baseURL)/oauth/token", "max_attempts": 1]])
        tokenServer.expireAccessTokens()
        let response = try get(relay)
        XCTAssertEqual(response.status, 503)
        XCTAssertFalse(api.requests.contains { $0.header("X-Injected") != nil })
        XCTAssertTrue(relay.stderrText.contains("not allowed in an HTTP header"), relay.stderrText)
    }
}

/// Refreshes whose outcome is unknown, and shutdown while a refresh is in flight: the refresh token
/// must never be presented twice, and a rotated one must reach the token file.
final class RefreshOutcomeTests: RelayTestCase {
    func testTimedOutRefreshIsNotPresentedAgainInTheSameCycle() throws {
        let relay = try startRelay(["timeouts": ["refresh_seconds": 0.4], "refresh": ["max_attempts": 4, "backoff_seconds": 0.05]])
        tokenServer.failureMode = .delay(1.2)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertTrue(relay.stderrText.contains("outcome unknown"), relay.stderrText)
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes == 1 }, "the slow server did rotate")
        XCTAssertEqual(tokenServer.refreshCalls, 1, "the same refresh token must not be queued again at a slow server")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    func testShutdownWaitsForARefreshInFlightAndSavesTheRotatedToken() throws {
        let relay = try startRelay(["timeouts": ["drain_seconds": 0.2]])
        tokenServer.failureMode = .delay(1.0)
        let forced = HTTPTestClient.concurrentlyAsync { try? HTTPTestClient.send(port: relay.adminPort, method: "POST", path: "/refresh") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls == 1 })
        relay.signal(SIGTERM)
        XCTAssertEqual(relay.waitForExit(timeout: 15), 0)
        _ = try forced.wait(timeout: 5)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(try readTokenFile()["refresh_token"] as? String, tokenServer.currentRefreshToken,
                       "the rotated refresh token must be on disk before the process exits")

        tokenServer.failureMode = .normal
        let restarted = try startRelay()
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(restarted).status, 200)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    func testRequestWithoutRefreshTokenIsAnsweredAtOnce() throws {
        let tokens = tokenServer.issueInitialTokens()
        try JSONSerialization.data(withJSONObject: ["access_token": tokens.access]).write(to: tokenFileURL)
        chmod(tokenFileURL.path, 0o600)
        let relay = try startRelay(["timeouts": ["hold_seconds": 10]])
        tokenServer.expireAccessTokens()
        let started = Date()
        XCTAssertEqual(try get(relay).status, 401)
        XCTAssertLessThan(Date().timeIntervalSince(started), 3, "released when the cycle ends, not at the hold timeout")
        XCTAssertEqual(try admin(relay, "/readyz").status, 503)
    }
}

/// Answers from which the refresh token's fate is unclear or must be salvaged: the old refresh token is
/// never presented early, a rotated one is never thrown away, and odd lifetimes cannot start a loop.
final class RefreshTokenSafetyTests: RelayTestCase {
    /// A token endpoint scripted per call; records the refresh tokens presented to it.
    private final class ScriptedTokenEndpoint: @unchecked Sendable {
        private let presented = Locked<[String]>([])
        private var server: MiniHTTPServer!
        var url: String { server.baseURL + "/oauth/token" }
        var presentedTokens: [String] { presented.withLock { $0 } }

        init(_ answer: @escaping @Sendable (_ call: Int, _ refreshToken: String) -> TestResponse) throws {
            server = try MiniHTTPServer { [presented] request in
                let token = FakeTokenServer.parseForm(request.bodyText)["refresh_token"] ?? ""
                let call = presented.withLock { $0.append(token); return $0.count }
                return answer(call, token)
            }
        }

        func stop() { server.stop() }
    }

    func testUnknownOutcomeIsNotFollowedByAnEarlyRefresh() throws {
        try skipUnlessSlowTestsEnabled("RefreshMachineTests.testWhileTheRefreshTokenIsInDoubtTheProactiveRefreshWaitsForExpiry; end to end: RefreshHoldOffTests")
        let relay = try startRelay(["timeouts": ["refresh_seconds": 0.4]])
        tokenServer.failureMode = .delay(1.0)
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 503)
        XCTAssertTrue(relay.stderrText.contains("outcome unknown"), relay.stderrText)
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.successfulRefreshes == 1 }, "the slow server did rotate")
        // The access token is valid for an hour: nothing justifies presenting the maybe-burnt refresh token now.
        XCTAssertFalse(waitUntil(timeout: 2.5) { self.tokenServer.refreshCalls > 1 }, "presented again without need")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try admin(relay, "/readyz").status, 200)
    }

    func testRotatedRefreshTokenInAnUnusableAnswerIsKept() throws {
        let endpoint = try ScriptedTokenEndpoint { call, token in
            if call == 1 { return .json(200, ["access_token": "bad\r\nX-Evil: 1", "refresh_token": "rotated-refresh-2", "expires_in": 60]) }
            guard token == "rotated-refresh-2" else { return .json(400, ["error": "invalid_grant"]) }
            return .json(200, ["access_token": "good-access-3", "refresh_token": "rotated-refresh-3", "expires_in": 3600])
        }
        defer { endpoint.stop() }
        let relay = try startRelay(["refresh": ["token_url": endpoint.url, "max_attempts": 1]])
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 503)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.readTokenFile()["refresh_token"] as? String) == "rotated-refresh-2" },
                      "the rotated refresh token reaches the token file")
        XCTAssertTrue(relay.stderrText.contains("kept the rotated refresh token"), relay.stderrText)

        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        XCTAssertEqual(endpoint.presentedTokens.dropFirst(), ["rotated-refresh-2"], "the burnt token is never presented again")
        XCTAssertEqual(try readTokenFile()["refresh_token"] as? String, "rotated-refresh-3")
    }

    func testZeroLifetimeDoesNotStartARefreshLoop() throws {
        let endpoint = try ScriptedTokenEndpoint { call, _ in
            .json(200, ["access_token": "access-\(call)", "refresh_token": "refresh-\(call)", "expires_in": 0])
        }
        defer { endpoint.stop() }
        let relay = try startRelay(["refresh": ["token_url": endpoint.url]])
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        XCTAssertTrue(relay.stderrText.contains("ignored expires_in"), relay.stderrText)
        XCTAssertFalse(waitUntil(timeout: 2) { endpoint.presentedTokens.count > 2 }, "refreshes: \(endpoint.presentedTokens.count)")
    }

    func testSubSecondLifetimesAreSpacedOut() throws {
        try skipUnlessSlowTestsEnabled("RefreshMachineTests.testTokensDueAtOnceAreRefreshedAtMostOncePerSecond; end to end: testZeroLifetimeDoesNotStartARefreshLoop")
        let endpoint = try ScriptedTokenEndpoint { call, _ in
            .json(200, ["access_token": "access-\(call)", "refresh_token": "refresh-\(call)", "expires_in": 0.2])
        }
        defer { endpoint.stop() }
        let relay = try startRelay(["refresh": ["token_url": endpoint.url]])
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        let before = endpoint.presentedTokens.count
        XCTAssertFalse(waitUntil(timeout: 3) { endpoint.presentedTokens.count > before + 4 },
                       "at most one time-triggered refresh per second: \(endpoint.presentedTokens.count - before) in 3 s")
    }
}

/// /readyz is 200 only with a usable token (issue #2): not once the access token is known dead and no
/// new one could be had, but also not merely because a refresh failed while the token still works.
final class ReadinessTests: RelayTestCase {
    private func readiness(_ relay: TokenRelayProcess) throws -> (status: Int, reason: String) {
        let response = try admin(relay, "/readyz")
        let body = try XCTUnwrap(JSONSerialization.jsonObject(with: response.body) as? [String: Any], response.bodyText)
        return (response.status, body["reason"] as? String ?? "")
    }

    func testRejectedTokenWithTheTokenEndpointFailingIsNotReadyUntilARefreshSucceeds() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 2]])
        tokenServer.failureMode = .unavailable(status: 500)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503)

        let notReady = try readiness(relay)
        XCTAssertEqual(notReady.status, 503, "every request gets 503 token_unavailable now")
        XCTAssertTrue(notReady.reason.contains("rejected"), notReady.reason)
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertEqual(try readiness(relay).status, 503, "a second failed cycle for the same token changes nothing")

        tokenServer.failureMode = .normal
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertEqual(try readiness(relay).status, 200, "ready again as soon as a refresh succeeds")
    }

    func testRejectedTokenWithTheTokenEndpointDownIsReadyAgainWhenNewTokensAreAdopted() throws {
        tokenServer.stop()
        let relay = try startRelay(["refresh": ["max_attempts": 1]])
        api.forceUnauthorizedOnce(path: "/resource")
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertEqual(try readiness(relay).status, 503)

        let fresh = tokenServer.issueInitialTokens()
        let staged = workDir.appendingPathComponent("staged.json")
        try writeTokenFile(at: staged, access: fresh.access, refresh: fresh.refresh)
        XCTAssertEqual(rename(staged.path, tokenFileURL.path), 0)
        XCTAssertTrue(waitUntil(timeout: 5) { (try? self.readiness(relay).status) == 200 }, "adopted from the token file")
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testTokenPastItsExpiryIsNotReady() throws {
        let tokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh, expiresAt: Date().addingTimeInterval(-60))
        tokenServer.failureMode = .unavailable(status: 503)
        let relay = try startRelay(["refresh": ["max_attempts": 1]])
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.refreshCalls >= 1 })
        let notReady = try readiness(relay)
        XCTAssertEqual(notReady.status, 503)
        XCTAssertTrue(notReady.reason.contains("expired"), notReady.reason)

        tokenServer.failureMode = .normal
        XCTAssertEqual(try admin(relay, "/refresh", method: "POST").status, 200)
        XCTAssertEqual(try readiness(relay).status, 200)
    }

    func testFailedProactiveRefreshKeepsAValidTokenReadyUntilItExpires() throws {
        try skipUnlessSlowTestsEnabled("RefreshMachineTests.testAFailedProactiveRefreshIsRetriedBeforeExpiryWhileTheTokenServes; end to end: ReadinessTests.testTokenPastItsExpiryIsNotReady")
        let tokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh, expiresAt: Date().addingTimeInterval(6))
        tokenServer.failureMode = .unavailable(status: 503)
        let relay = try startRelay(["refresh": ["max_attempts": 1]])
        XCTAssertTrue(waitUntil(timeout: 6) { (try? self.admin(relay, "/status").bodyText.contains("failed")) ?? false },
                      "the proactive refresh ran and failed")
        XCTAssertEqual(try readiness(relay).status, 200, "the token still works")
        XCTAssertEqual(try get(relay).status, 200)

        XCTAssertTrue(waitUntil(timeout: 10) { (try? self.readiness(relay).reason.contains("expired")) ?? false }, "not ready once it expires")
        XCTAssertEqual(try readiness(relay).status, 503)
    }
}
