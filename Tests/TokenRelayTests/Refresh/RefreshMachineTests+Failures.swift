import Foundation
import XCTest
@testable import TokenRelay

/// Retry-After, login required, tokens from the store, persist failures, shutdown and settings (see
/// `RefreshMachineTests.swift` for the harness).
extension RefreshMachineTests {
    // MARK: - Retry-After

    func testRetryAfterSpacesRetriesAndHoldsOffTheNextCycle() {
        makeMachine { $0.maxAttempts = 2; $0.backoffSeconds = 0.05 }
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "token endpoint answered 429", outcomeUnknown: false), retryAfter: 5)
        XCTAssertEqual(timers[.attempt], monotonic + 5, "Retry-After wins over the 0.05 s backoff")
        advance(5)
        lockAcquired(store: .tokens(machine.tokens))
        answer(.transient(reason: "token endpoint answered 429", outcomeUnknown: false), retryAfter: 5)
        XCTAssertEqual(machine.state, .ready, "attempts exhausted")
        let askedAt = monotonic
        XCTAssertEqual(unauthorized(1), .hold)
        XCTAssertEqual(timers[.attempt], askedAt + 5, "the next cycle waits for the last Retry-After too")
    }

    func testTransientFailuresAreRetriedWithBackoffThenGiveUp() {
        makeMachine { $0.maxAttempts = 3; $0.backoffSeconds = 1 }
        XCTAssertEqual(unauthorized(1), .hold)
        for attempt in 1...3 {
            attemptReachesTokenEndpoint()
            answer(.transient(reason: "token endpoint answered 503", outcomeUnknown: false))
            if attempt < 3 { XCTAssertEqual(timers[.attempt].map { $0 - monotonic }, pow(2, Double(attempt - 1))) }
            advance(timers[.attempt].map { $0 - monotonic } ?? 0)
        }
        XCTAssertEqual(presentations, 3)
        XCTAssertEqual(releases, [.unavailable(reason: "token endpoint answered 503")])
        XCTAssertTrue(machine.isAccessTokenKnownDead)
    }

    // MARK: - Login required

    func testARejectedRefreshLatchesLoginRequired() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.rejected(status: 400, oauthError: "invalid_grant"))
        XCTAssertEqual(releases, [.rejected])
        XCTAssertEqual(machine.state, .loginRequired)
        XCTAssertEqual(admit(), .loginRequired)
        XCTAssertEqual(unauthorized(1), .passThrough)
        XCTAssertEqual(presentations, 1, "no storm")
        XCTAssertTrue(actions.contains(.count(.refreshError(code: "invalid_grant"))))
        let (immediate, new) = machine.forceRefresh(now: now)
        record(new)
        XCTAssertNil(immediate)
        XCTAssertEqual(machine.state, .refreshing, "an operator clears the latch")
    }

    func testNoRefreshTokenMeansLoginRequiredWithoutPresentingAnything() {
        makeMachine(refreshToken: nil)
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 0)
        XCTAssertEqual(machine.state, .loginRequired)
    }

    // MARK: - Tokens from the store

    func testTokensAnotherProcessRotatedAreAdoptedUnderTheLock() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint(store: TokenSet(accessToken: "a-other", refreshToken: "r-other"))
        XCTAssertEqual(presentations, 0, "a burnt refresh token is never presented")
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertEqual(machine.tokens.refreshToken, "r-other")
    }

    func testAStoreHoldingARefreshTokenWePresentedIsNotAdopted() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "token endpoint answered 503", outcomeUnknown: false))
        advance(1)
        lockAcquired(store: .tokens(TokenSet(accessToken: "a-old", refreshToken: "r1")))
        XCTAssertEqual(presentations, 2)
        XCTAssertEqual(machine.generation, 1)
    }

    func testAChangedStoreClearsLoginRequired() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.rejected(status: 400, oauthError: "invalid_grant"))
        record(machine.storeRead(.tokens(TokenSet(accessToken: "a-new", refreshToken: "r-new")), now: now))
        XCTAssertEqual(machine.state, .ready)
        XCTAssertEqual(admit(), .send(generation: 2))
    }

    // MARK: - Persist failures

    func testUnsavedTokensAreServedVisiblyAndTheWriteIsRetriedWithBackoff() {
        makeMachine { $0.backoffSeconds = 0.5 }
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        record(machine.persistFailed("No such file or directory", now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)], "serving beats failing")
        XCTAssertTrue(machine.hasUnsavedTokens)
        XCTAssertTrue(machine.degradedReason?.contains("not saved") ?? false)
        XCTAssertEqual(timers[.saveRetry], monotonic + 0.5)
        advance(0.5)
        XCTAssertEqual(writes.count, 2)
        XCTAssertEqual(writes.last?.refreshToken, "r2")
        record(machine.persistFailed("No such file or directory", now: now))
        XCTAssertEqual(timers[.saveRetry], monotonic + 1, "backoff doubles")
        advance(1)
        record(machine.persisted(now: now))
        XCTAssertFalse(machine.hasUnsavedTokens)
        XCTAssertNil(timers[.saveRetry])
    }

    func testACycleWriteWaitsForARetryWriteInFlight() {
        makeMachine()
        renewViaUnauthorized("a2", "r2")
        XCTAssertEqual(unauthorized(2), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a3", "r3"))
        record(machine.persistFailed("disk full", now: now))
        advance(0.5)  // the retry write of a3/r3 starts
        XCTAssertTrue(machine.isTalkingToTokenEndpoint)
        XCTAssertEqual(unauthorized(3), .hold)
        attemptReachesTokenEndpoint()
        let writesBefore = writes.count
        answer(grant("a4", "r4"))
        XCTAssertEqual(writes.count, writesBefore, "queued behind the retry")
        record(machine.persisted(now: now))  // the retry's write
        XCTAssertEqual(writes.last?.refreshToken, "r4", "then the newer tokens")
        record(machine.persisted(now: now))
        XCTAssertEqual(releases.last, .renewed(generation: 4))
        XCTAssertFalse(machine.hasUnsavedTokens)
    }

    func testARotatedRefreshTokenInAnUnusableAnswerIsKept() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.invalidResponse(reason: "access_token contains characters not allowed in an HTTP header", rotation: .rotated(to: "r2")))
        XCTAssertEqual(writes.last?.refreshToken, "r2")
        XCTAssertEqual(releases, [])
        record(machine.persisted(now: now))
        XCTAssertEqual(machine.tokens.refreshToken, "r2")
        XCTAssertEqual(machine.tokens.accessToken, "a1")
        XCTAssertEqual(releases.count, 1)
    }

    // MARK: - Shutdown and settings

    func testShutdownWaitsForTheExchangeInFlightAndStartsNothingNew() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        record(machine.shutdown(now: now))
        XCTAssertTrue(machine.isTalkingToTokenEndpoint)
        XCTAssertNotNil(machine.exchangeInFlight, "a loop stopped now abandons it")
        answer(grant("a2", "r2"))
        XCTAssertTrue(machine.isTalkingToTokenEndpoint, "until the rotated token is written")
        XCTAssertNil(machine.exchangeInFlight)
        XCTAssertEqual(machine.answerBeingSaved?.refreshToken, "r2", "a loop stopped now writes it at exit")
        record(machine.persisted(now: now))
        XCTAssertNil(machine.answerBeingSaved)
        XCTAssertFalse(machine.isTalkingToTokenEndpoint)
        XCTAssertEqual(actions.last, .tokenEndpointIdle)
        XCTAssertNil(timers[.proactive])
        XCTAssertEqual(unauthorized(2), .noRefresh, "no cycle will release a hold: answered at once")
        XCTAssertEqual(machine.state, .ready, "no new cycle after shutdown")
    }

    /// A 401 that joins a cycle still running at shutdown is held and released by it; with none running,
    /// the answer is immediate (a hold would only wait out hold_seconds).
    func testA401AfterShutdownIsHeldOnlyByACycleInFlight() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        record(machine.shutdown(now: now))
        XCTAssertEqual(unauthorized(1), .hold, "joins the cycle, which still ends")
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        record(machine.persisted(now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertEqual(unauthorized(1), .replay, "an older generation is replayed with the new token")
        XCTAssertEqual(unauthorized(2), .noRefresh)
        XCTAssertEqual(presentations, 1)
    }

    func testAForcedRefreshJoinsTheRunningCycle() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        let (immediate, new) = machine.forceRefresh(now: now)
        record(new)
        XCTAssertNil(immediate, "answered by the cycle's release")
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        record(machine.persisted(now: now))
        XCTAssertEqual(presentations, 1)
        XCTAssertEqual(releases, [.renewed(generation: 2)])
    }

    func testAForcedRefreshDuringShutdownIsAnsweredAtOnce() {
        makeMachine()
        record(machine.shutdown(now: now))
        let (immediate, _) = machine.forceRefresh(now: now)
        XCTAssertEqual(immediate, .unavailable(reason: "shutting down"))
        XCTAssertEqual(presentations, 0)
    }

    func testWithoutAnAccessTokenTheFirstRequestWaitsForOne() {
        var empty = Machine.Settings()
        empty.needsRefreshToken = false
        machine = Machine(tokens: TokenSet(accessToken: "", refreshToken: nil), settings: empty, now: now)
        timers = [:]
        record(machine.start(now: now))
        XCTAssertEqual(machine.state, .refreshing, "fetched at start")
        XCTAssertEqual(admit(), .hold)
        attemptReachesTokenEndpoint()
        answer(.granted(TokenGrant(accessToken: "a1", refreshToken: nil, expiresIn: 60)))
        record(machine.persisted(now: now))
        XCTAssertEqual(admit(), .send(generation: 2))
    }

    func testTimersThatNoLongerApplyAreIgnored() {
        makeMachine()
        let before = actions.count
        record(machine.timerFired(.attempt, now: now))
        record(machine.timerFired(.stormRecovery, now: now))
        record(machine.timerFired(.saveRetry, now: now))
        XCTAssertEqual(actions.count, before)
        record(machine.lockAcquired(store: nil, now: now))
        XCTAssertEqual(actions.last, .releaseLock, "a lock nobody waits for is given back")
        XCTAssertEqual(presentations, 0)
    }

    func testLockTimeoutsCountAsAttempts() {
        makeMachine { $0.maxAttempts = 2; $0.backoffSeconds = 0.1 }
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockTimedOut(now: now))
        advance(1)
        record(machine.lockTimedOut(now: now))
        XCTAssertEqual(machine.state, .ready)
        XCTAssertEqual(presentations, 0)
    }

    func testNewSettingsApplyFromTheNextCycle() {
        makeMachine { $0.maxAttempts = 1 }
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        var settings = machine.settings
        settings.maxAttempts = 3
        record(machine.apply(settings, now: now))
        answer(.transient(reason: "token endpoint answered 503", outcomeUnknown: false))
        XCTAssertEqual(machine.state, .ready, "the cycle in flight kept max_attempts 1")
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "token endpoint answered 503", outcomeUnknown: false))
        XCTAssertEqual(machine.state, .refreshing, "the next cycle retries")
    }
}
