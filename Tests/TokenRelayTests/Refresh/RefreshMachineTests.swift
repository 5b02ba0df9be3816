import Foundation
import XCTest
@testable import TokenRelay

/// The refresh rules, in process, with a manual clock: every rule of `RefreshMachine` in milliseconds.
final class RefreshMachineTests: XCTestCase {
    typealias Machine = RefreshMachine
    typealias Action = RefreshMachine.Action
    // The harness is internal, not private: the tests in RefreshMachineTests+HoldOff/+Failures/+Fleet.swift
    // use it too.

    var monotonic = 1000.0
    var wall = Date(timeIntervalSince1970: 1_800_000_000)
    var machine: Machine!
    /// Armed timers and when they fire (monotonic), as the driver would keep them.
    var timers: [Machine.Timer: Double] = [:]
    /// Everything the machine asked for, in order.
    var actions: [Action] = []

    var now: Machine.Instant { Machine.Instant(monotonic: monotonic, wall: wall, jitter: 0.5) }

    func makeMachine(expiresIn: Double? = 3600, refreshToken: String? = "r1", inFlight: RefreshInFlightRead? = nil,
                             _ configure: (inout Machine.Settings) -> Void = { _ in }) {
        var settings = Machine.Settings()
        settings.backoffSeconds = 0.5
        settings.refreshTimeout = 10
        configure(&settings)
        let tokens = TokenSet(accessToken: "a1", refreshToken: refreshToken, expiresAt: expiresIn.map { wall.addingTimeInterval($0) })
        machine = Machine(tokens: tokens, settings: settings, now: now)
        record(machine.start(now: now, inFlight: inFlight))
    }

    @discardableResult
    func record(_ new: [Action]) -> [Action] {
        for action in new {
            switch action {
            case .schedule(let timer, let at): timers[timer] = at
            case .cancel(let timer): timers[timer] = nil
            default: break
            }
        }
        actions += new
        return new
    }

    /// Moves the clock forward, firing due timers in order.
    func advance(_ seconds: Double) {
        let target = monotonic + seconds
        while let (timer, at) = timers.filter({ $0.value <= target }).min(by: { $0.value < $1.value }) {
            wall = wall.addingTimeInterval(max(0, at - monotonic))
            monotonic = max(monotonic, at)
            timers[timer] = nil
            record(machine.timerFired(timer, now: now))
        }
        wall = wall.addingTimeInterval(target - monotonic)
        monotonic = target
    }

    /// Every admission in these tests also checks the shortcut a driver may take instead of asking
    /// (`timeIndependentAdmission`): when the machine offers one, asking gives the same answer, and emits
    /// nothing.
    func admit(file: StaticString = #filePath, line: UInt = #line) -> Machine.Admission {
        let shortcut = machine.timeIndependentAdmission
        let (admission, new) = machine.admit(now: now)
        if let shortcut {
            XCTAssertEqual(admission, .send(generation: shortcut), "the shortcut disagrees with admit", file: file, line: line)
            XCTAssertTrue(new.isEmpty, "admit emitted actions where the shortcut answers without it", file: file, line: line)
        }
        record(new)
        return admission
    }

    func unauthorized(_ generation: UInt64) -> Machine.UnauthorizedDecision {
        let (decision, new) = machine.unauthorized(sentGeneration: generation, now: now)
        record(new)
        return decision
    }

    func count(_ predicate: (Action) -> Bool) -> Int { actions.filter(predicate).count }
    var presentations: Int { count { if case .presentRefreshToken = $0 { return true } else { return false } } }
    var releases: [Machine.Outcome] { actions.compactMap { if case .release(let outcome) = $0 { return outcome } else { return nil } } }
    var writes: [TokenSet] { actions.compactMap { if case .persist(let tokens) = $0 { return tokens } else { return nil } } }

    func grant(_ access: String, _ refresh: String, expiresIn: Double = 3600) -> TokenEndpointResult {
        .granted(TokenGrant(accessToken: access, refreshToken: refresh, expiresIn: expiresIn))
    }

    /// Runs the cycle's next attempt up to the token endpoint (the store holds what we hold).
    func attemptReachesTokenEndpoint(store: TokenSet? = nil, inFlight: RefreshInFlightRead? = nil) {
        advance(0)
        guard case .refreshing(let cycle) = machine.phase, case .acquiringLock = cycle.step else { return XCTFail("lock not requested") }
        lockAcquired(store: .tokens(store ?? machine.tokens), inFlight: inFlight)
    }

    /// The lock is taken; an in-flight record the machine asks for is written at once.
    func lockAcquired(store: Machine.StoreRead?, inFlight: RefreshInFlightRead? = nil) {
        record(machine.lockAcquired(store: store, inFlight: inFlight, now: now))
        if case .refreshing(let cycle) = machine.phase, case .recordingInFlight = cycle.step { record(machine.inFlightRecorded(now: now)) }
    }

    func answer(_ result: TokenEndpointResult, retryAfter: Double? = nil, after seconds: Double = 0.05) {
        advance(seconds)
        record(machine.tokenEndpointAnswered(result, retryAfter: retryAfter, now: now))
    }

    func renewViaUnauthorized(_ access: String, _ refresh: String) {
        XCTAssertEqual(unauthorized(machine.generation), .hold)
        attemptReachesTokenEndpoint()
        answer(grant(access, refresh))
        record(machine.persisted(now: now))
    }

    // MARK: - Coalescing and generations

    func testABurstOf401sForOneGenerationCausesOnePresentation() {
        makeMachine()
        XCTAssertEqual(admit(), .send(generation: 1))
        for _ in 0..<50 { XCTAssertEqual(unauthorized(1), .hold) }
        XCTAssertEqual(admit(), .hold, "new requests wait during a reactive cycle")
        XCTAssertFalse(actions.contains { if case .acquireLock = $0 { return true } else { return false } },
                       "the first attempt never runs inside the call that started the cycle")
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        XCTAssertEqual(releases, [], "persist before release")
        XCTAssertEqual(writes.last?.refreshToken, "r2")
        record(machine.persisted(now: now))
        XCTAssertEqual(presentations, 1)
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertEqual(admit(), .send(generation: 2))
        XCTAssertTrue(actions.contains(.releaseLock))
    }

    func testA401FromAnOlderGenerationIsReplayedWithoutARefresh() {
        makeMachine()
        renewViaUnauthorized("a2", "r2")
        let before = actions.count
        XCTAssertEqual(unauthorized(1), .replay)
        XCTAssertEqual(machine.state, .ready)
        XCTAssertEqual(actions.count, before)
    }

    // MARK: - Proactive refresh

    func testProactiveRefreshRunsAheadOfExpiryWithoutHoldingRequests() {
        makeMachine(expiresIn: 100)  // lifetime 100 s: skew 10 s, plus jitter 0.5 × 20 % of it
        XCTAssertEqual(timers[.proactive], 1000 + 89)
        advance(89)
        XCTAssertEqual(machine.state, .refreshing)
        XCTAssertEqual(machine.mode, .proactive)
        XCTAssertEqual(admit(), .send(generation: 1), "the current token still works")
        XCTAssertEqual(unauthorized(1), .hold, "a 401 meanwhile joins the cycle")
        XCTAssertEqual(machine.mode, .reactive)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2", expiresIn: 100))
        record(machine.persisted(now: now))
        XCTAssertEqual(presentations, 1)
        XCTAssertEqual(timers[.proactive].map { $0 - monotonic }, 89)
    }

    func testTokensDueAtOnceAreRefreshedAtMostOncePerSecond() {
        makeMachine(expiresIn: 100)
        advance(89)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2", expiresIn: 0.2))
        record(machine.persisted(now: now))
        let next = timers[.proactive] ?? 0
        XCTAssertGreaterThanOrEqual(next - (1000 + 89), Machine.minimumCycleSpacing - 0.0001)
    }

    /// POST /refresh in a loop: a forced refresh within `forcedRefreshReuseSeconds` of a renewal gets that
    /// renewal's result (no second rotation); later, or once the new token is refused, one starts again.
    func testForcedRefreshesRightAfterARenewalShareIt() {
        makeMachine(expiresIn: 3600)
        record(machine.forceRefresh(now: now).1)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        record(machine.persisted(now: now))
        XCTAssertEqual(presentations, 1)
        let renewed = machine.generation
        for _ in 0..<29 {
            advance(0.1)
            let (immediate, new) = machine.forceRefresh(now: now)
            record(new)
            XCTAssertEqual(immediate, .renewed(generation: renewed))
        }
        advance(0.5)
        XCTAssertEqual(presentations, 1, "29 more calls within the window rotated nothing")

        advance(Machine.forcedRefreshReuseSeconds)
        let (later, new) = machine.forceRefresh(now: now)
        record(new)
        XCTAssertNil(later, "after the window a forced refresh refreshes")
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 2)
        answer(grant("a3", "r3"))
        record(machine.persisted(now: now))

        XCTAssertEqual(unauthorized(machine.generation), .hold, "the renewed token refused at once")
        let (afterRefusal, more) = machine.forceRefresh(now: now)
        record(more)
        XCTAssertNil(afterRefusal, "a token known dead is no result to share")
    }

    /// Four streamed uploads answered 401 after their bodies went: none can be replayed, but each counts
    /// for the refresh rules: one cycle (coalesced), one presentation, and the next request is held for it.
    func testUnreplayableUnauthorizedAnswersStartOneCoalescedRefresh() {
        makeMachine(expiresIn: 3600)
        for _ in 0..<4 { record(machine.unauthorizedNotReplayable(sentGeneration: 1, now: now)) }
        XCTAssertEqual(machine.state, .refreshing)
        XCTAssertEqual(admit(), .hold, "the next request waits for the fresh token instead of earning a 401")
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 1)
        answer(grant("a2", "r2"))
        record(machine.persisted(now: now))
        XCTAssertEqual(admit(), .send(generation: 2))
        record(machine.unauthorizedNotReplayable(sentGeneration: 1, now: now))
        XCTAssertEqual(machine.state, .ready, "an answer to the old token says nothing against the new one")
        XCTAssertEqual(presentations, 1)
    }

    func testWhileTheRefreshTokenIsInDoubtTheProactiveRefreshWaitsForExpiry() {
        makeMachine(expiresIn: 3600)
        let (_, new) = machine.forceRefresh(now: now)
        record(new)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "timed out", outcomeUnknown: true), after: 10)
        XCTAssertEqual(admit(), .send(generation: 1), "the token still works: requests flow during the hold-off")
        advance(1)  // hold-off over
        record(machine.storeRead(.tokens(machine.tokens), now: now))
        XCTAssertEqual(timers[.proactive].map { ($0 - monotonic).rounded() }, 3600 - 11, "at expiry, not skew-early")
        XCTAssertEqual(presentations, 1)
        advance(3600 - 11)
        XCTAssertEqual(machine.mode, .reactive, "the token is dead by then: requests wait")
    }

    func testAFailedProactiveRefreshIsRetriedBeforeExpiryWhileTheTokenServes() {
        makeMachine(expiresIn: 100) { $0.maxAttempts = 1; $0.backoffSeconds = 0.5 }
        advance(89)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "token endpoint answered 503", outcomeUnknown: false), after: 0)
        XCTAssertEqual(machine.state, .ready)
        XCTAssertFalse(machine.isAccessTokenKnownDead, "a failed refresh says nothing against a token nobody refused")
        XCTAssertEqual(admit(), .send(generation: 1))
        XCTAssertEqual(timers[.proactive].map { $0 - monotonic }, 2, "retried ahead of expiry")
    }

    // MARK: - Storm guard

    func testStormGuardPassesThrough401sAfterTooManyReactiveRefreshes() {
        makeMachine { $0.stormMaxRefreshes = 2; $0.stormWindowSeconds = 30 }
        renewViaUnauthorized("a2", "r2")
        renewViaUnauthorized("a3", "r3")
        XCTAssertEqual(unauthorized(3), .passThrough)
        XCTAssertEqual(machine.state, .degraded)
        XCTAssertNotNil(machine.degradedReason)
        XCTAssertEqual(presentations, 2)
        advance(31)
        XCTAssertEqual(machine.state, .ready, "the window passed")
        XCTAssertEqual(unauthorized(3), .hold)
    }

}
