import Foundation
import XCTest
@testable import TokenRelay

/// The refresh rules, in process, with a manual clock: every rule of `RefreshMachine` in milliseconds.
final class RefreshMachineTests: XCTestCase {
    typealias Machine = RefreshMachine
    typealias Action = RefreshMachine.Action

    private var monotonic = 1000.0
    private var wall = Date(timeIntervalSince1970: 1_800_000_000)
    private var machine: Machine!
    /// Armed timers and when they fire (monotonic), as the driver would keep them.
    private var timers: [Machine.Timer: Double] = [:]
    /// Everything the machine asked for, in order.
    private var actions: [Action] = []

    private var now: Machine.Instant { Machine.Instant(monotonic: monotonic, wall: wall, jitter: 0.5) }

    private func makeMachine(expiresIn: Double? = 3600, refreshToken: String? = "r1", inFlight: RefreshInFlightRead? = nil,
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
    private func record(_ new: [Action]) -> [Action] {
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
    private func advance(_ seconds: Double) {
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
    private func admit(file: StaticString = #filePath, line: UInt = #line) -> Machine.Admission {
        let shortcut = machine.timeIndependentAdmission
        let (admission, new) = machine.admit(now: now)
        if let shortcut {
            XCTAssertEqual(admission, .send(generation: shortcut), "the shortcut disagrees with admit", file: file, line: line)
            XCTAssertTrue(new.isEmpty, "admit emitted actions where the shortcut answers without it", file: file, line: line)
        }
        record(new)
        return admission
    }

    private func unauthorized(_ generation: UInt64) -> Machine.UnauthorizedDecision {
        let (decision, new) = machine.unauthorized(sentGeneration: generation, now: now)
        record(new)
        return decision
    }

    private func count(_ predicate: (Action) -> Bool) -> Int { actions.filter(predicate).count }
    private var presentations: Int { count { if case .presentRefreshToken = $0 { return true } else { return false } } }
    private var releases: [Machine.Outcome] { actions.compactMap { if case .release(let outcome) = $0 { return outcome } else { return nil } } }
    private var writes: [TokenSet] { actions.compactMap { if case .persist(let tokens) = $0 { return tokens } else { return nil } } }

    private func grant(_ access: String, _ refresh: String, expiresIn: Double = 3600) -> TokenEndpointResult {
        .granted(TokenGrant(accessToken: access, refreshToken: refresh, expiresIn: expiresIn))
    }

    /// Runs the cycle's next attempt up to the token endpoint (the store holds what we hold).
    private func attemptReachesTokenEndpoint(store: TokenSet? = nil, inFlight: RefreshInFlightRead? = nil) {
        advance(0)
        guard case .refreshing(let cycle) = machine.phase, case .acquiringLock = cycle.step else { return XCTFail("lock not requested") }
        lockAcquired(store: .tokens(store ?? machine.tokens), inFlight: inFlight)
    }

    /// The lock is taken; an in-flight record the machine asks for is written at once.
    private func lockAcquired(store: Machine.StoreRead?, inFlight: RefreshInFlightRead? = nil) {
        record(machine.lockAcquired(store: store, inFlight: inFlight, now: now))
        if case .refreshing(let cycle) = machine.phase, case .recordingInFlight = cycle.step { record(machine.inFlightRecorded(now: now)) }
    }

    private func answer(_ result: TokenEndpointResult, retryAfter: Double? = nil, after seconds: Double = 0.05) {
        advance(seconds)
        record(machine.tokenEndpointAnswered(result, retryAfter: retryAfter, now: now))
    }

    private func renewViaUnauthorized(_ access: String, _ refresh: String) {
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

    // MARK: - Unknown outcome: the hold-off

    func testNoRefreshTokenLeavesBeforeRefreshTimeoutPlusBackoffSinceTheUnknownOutcomeWasSent() {
        makeMachine { $0.refreshTimeout = 10; $0.backoffSeconds = 1 }
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        let sentAt = monotonic
        answer(.transient(reason: "token endpoint timed out", outcomeUnknown: true), after: 10)
        XCTAssertEqual(releases, [.unavailable(reason: "refresh outcome unknown (token endpoint timed out); the refresh token is not presented again for now")])
        XCTAssertEqual(timers[.holdOff], sentAt + 10 + 1)
        XCTAssertEqual(unauthorized(1), .unavailable(retryAfter: 1))
        XCTAssertEqual(admit(), .unavailable(retryAfter: 1), "the token is known dead")
        let (immediate, new) = machine.forceRefresh(now: now)
        record(new)
        XCTAssertNotNil(immediate, "a forced refresh cannot lift the hold-off")
        XCTAssertTrue(machine.degradedReason?.contains("outcome unknown") ?? false)
        XCTAssertEqual(presentations, 1)

        advance(1)
        XCTAssertEqual(actions.last(where: { $0 == .readStore }), .readStore, "the store is re-read first")
        record(machine.storeRead(.tokens(machine.tokens), now: now))
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 2)
        let secondSentAt = monotonic
        answer(.transient(reason: "connection lost", outcomeUnknown: true), after: 0.2)
        XCTAssertEqual(timers[.holdOff], secondSentAt + 10 + 2, "the backoff doubles for unknown outcomes in a row")
    }

    func testTokensInTheStoreEndTheHoldOff() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "timed out", outcomeUnknown: true), after: 10)
        record(machine.storeRead(.tokens(TokenSet(accessToken: "a-other", refreshToken: "r-other")), now: now))
        XCTAssertEqual(releases.last, .renewed(generation: 2))
        XCTAssertNil(machine.holdOff)
        XCTAssertEqual(admit(), .send(generation: 2))
    }

    func testAnUnreadableAnswerHoldsOffToo() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.invalidResponse(reason: "response body is not a JSON object", rotation: .unknown))
        XCTAssertNotNil(machine.holdOff)
        XCTAssertEqual(unauthorized(1), .unavailable(retryAfter: 11))
    }

    func testClientCredentialsRetryAnUnknownOutcome() {
        makeMachine(refreshToken: nil) { $0.needsRefreshToken = false }
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "timed out", outcomeUnknown: true))
        XCTAssertNil(machine.holdOff, "nothing to burn: no hold-off")
        XCTAssertEqual(machine.state, .refreshing)
    }

    // MARK: - The in-flight record: the hold-off across restarts and processes

    private var recordsWritten: [RefreshInFlightRecord] {
        actions.compactMap { if case .recordInFlight(let record) = $0 { return record } else { return nil } }
    }
    private var removals: Int { count { $0 == .removeInFlightRecord } }

    private func index(of action: Action) -> Int? { actions.lastIndex(of: action) }

    func testNoRefreshTokenLeavesBeforeItsInFlightRecordIsOnDiskAndTheRecordGoesOnceTheAnswerIsSaved() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockAcquired(store: .tokens(machine.tokens), inFlight: RefreshInFlightRead.none, now: now))
        XCTAssertEqual(recordsWritten, [RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r1"), sentAt: wall)])
        XCTAssertFalse(recordsWritten.first?.fingerprint.contains("r1") ?? true, "a fingerprint, never the token")
        XCTAssertEqual(presentations, 0, "not before the record is on disk")
        XCTAssertTrue(machine.isTalkingToTokenEndpoint, "a draining shutdown waits for the write")
        XCTAssertNil(machine.exchangeInFlight, "nothing has left yet")
        record(machine.inFlightRecorded(now: now))
        XCTAssertEqual(presentations, 1)
        XCTAssertEqual(machine.exchangeInFlight?.fingerprint, TokenFingerprint.of("r1"), "what a shutdown now would abandon")
        answer(grant("a2", "r2"))
        XCTAssertEqual(removals, 0, "not before the answer is saved")
        record(machine.persisted(now: now))
        XCTAssertEqual(removals, 1)
        XCTAssertLessThan(index(of: .removeInFlightRecord) ?? .max, index(of: .releaseLock) ?? -1,
                          "removed under the lock: never the next process's record")
        XCTAssertNil(machine.exchangeInFlight)
    }

    func testARecordThatCannotBeWrittenIsATransientFailureAndNothingLeaves() {
        makeMachine { $0.maxAttempts = 2; $0.backoffSeconds = 1 }
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockAcquired(store: .tokens(machine.tokens), now: now))
        record(machine.inFlightRecordFailed("in-flight refresh marker /x/tokens.json.refreshing: rename failed: Read-only file system", now: now))
        XCTAssertEqual(presentations, 0)
        XCTAssertTrue(actions.contains(.log(.error, "could not record the refresh in flight; the refresh token was not sent", [:])))
        XCTAssertTrue(actions.contains(.releaseLock))
        XCTAssertNil(machine.holdOff, "nothing left: no hold-off")
        XCTAssertEqual(timers[.attempt], monotonic + 1, "retried with backoff")
        advance(1)
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 1, "the next attempt's record was written")
    }

    func testAnUnknownOutcomeKeepsTheRecordAndDefiniteAnswersRemoveIt() {
        makeMachine { $0.maxAttempts = 3 }
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "token endpoint answered 503", outcomeUnknown: false))
        XCTAssertEqual(removals, 1, "a 503: nothing in progress at the server")
        advance(1)
        lockAcquired(store: .tokens(machine.tokens))
        answer(.rejected(status: 400, oauthError: "invalid_grant"))
        XCTAssertEqual(removals, 2, "rejected: the server is done with it")

        makeMachine()
        actions = []
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.transient(reason: "token endpoint timed out", outcomeUnknown: true), after: 10)
        XCTAssertEqual(removals, 0, "kept: a restart must hold off too")
        answer(.invalidResponse(reason: "response body is not a JSON object", rotation: .unknown))
        XCTAssertEqual(removals, 0)
    }

    func testAnUnsavedAnswerKeepsTheRecord() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        record(machine.persistFailed("No such file or directory", now: now))
        XCTAssertEqual(removals, 0, "the token file still holds the presented refresh token: a restart holds it back")
    }

    func testARecordFromAPreviousRunHoldsOffUntilRefreshTimeoutPlusBackoffAfterItWasSent() {
        let sent = RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r1"), sentAt: wall.addingTimeInterval(-3))
        makeMachine(inFlight: .record(sent)) { $0.refreshTimeout = 10; $0.backoffSeconds = 1 }
        XCTAssertEqual(timers[.holdOff], monotonic + 8, "sent 3 s ago: 10 + 1 - 3")
        XCTAssertTrue(machine.degradedReason?.contains("a refresh sent by a previous run may still be in progress") ?? false,
                      machine.degradedReason ?? "nil")
        XCTAssertEqual(admit(), .send(generation: 1), "the token in hand may still work")
        XCTAssertEqual(unauthorized(1), .unavailable(retryAfter: 8))
        XCTAssertEqual(admit(), .unavailable(retryAfter: 8), "known dead now")
        let (immediate, new) = machine.forceRefresh(now: now)
        record(new)
        XCTAssertNotNil(immediate, "an operator cannot lift it either")
        XCTAssertEqual(removals, 0)
        advance(7.9)
        XCTAssertEqual(unauthorized(1), .unavailable(retryAfter: 1))
        XCTAssertEqual(presentations, 0)

        advance(0.1)
        XCTAssertEqual(actions.last(where: { $0 == .readStore }), .readStore, "the token file is re-read first")
        record(machine.storeRead(.tokens(machine.tokens), inFlight: .record(sent), now: now))
        XCTAssertNil(machine.holdOff, "the same record does not hold off twice")
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint(inFlight: .record(sent))
        XCTAssertEqual(presentations, 1, "presented once more, after the hold-off")
        XCTAssertEqual(recordsWritten.count, 1, "its own record replaces the old one")
    }

    func testItsOwnRecordReadBackHoldsNothingOffTwice() throws {
        makeMachine { $0.refreshTimeout = 10; $0.backoffSeconds = 1 }
        wall = wall.addingTimeInterval(0.000_4)  // sub-millisecond: the file keeps milliseconds
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        let written = try XCTUnwrap(recordsWritten.last)
        let readBack = try XCTUnwrap(RefreshInFlightMarker.decode(RefreshInFlightMarker.encode(written)))
        answer(.transient(reason: "token endpoint timed out", outcomeUnknown: true), after: 10)
        advance(1)
        record(machine.storeRead(.tokens(machine.tokens), inFlight: .record(readBack), now: now))
        XCTAssertNil(machine.holdOff, "its own hold-off covered it")
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint(inFlight: .record(readBack))
        XCTAssertEqual(presentations, 2)
        XCTAssertFalse(actions.contains { if case .log(_, let message, _) = $0 { return message.contains("previous run") } else { return false } })
    }

    func testTheAnswerSavedByThePreviousRunIsAdoptedWhenTheHoldOffEnds() {
        let sent = RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r1"), sentAt: wall)
        makeMachine(inFlight: .record(sent)) { $0.refreshTimeout = 10; $0.backoffSeconds = 1 }
        XCTAssertEqual(unauthorized(1), .unavailable(retryAfter: 11))
        advance(11)
        record(machine.storeRead(.tokens(TokenSet(accessToken: "a2", refreshToken: "r2")), inFlight: RefreshInFlightRead.none, now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertEqual(admit(), .send(generation: 2))
        XCTAssertEqual(presentations, 0)
    }

    func testARecordForAnotherRefreshTokenIsStaleAndRemovedOnlyUnderTheLock() {
        let stale = RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r0"), sentAt: wall)
        makeMachine(inFlight: .record(stale))
        XCTAssertNil(machine.holdOff)
        XCTAssertEqual(removals, 0, "without the lock it could be another process's record by now")
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockAcquired(store: .tokens(machine.tokens), inFlight: .record(stale), now: now))
        XCTAssertEqual(removals, 1)
        XCTAssertEqual(recordsWritten.count, 1)
        record(machine.inFlightRecorded(now: now))
        XCTAssertEqual(presentations, 1)
    }

    func testAnExpiredRecordLeavesTheRefreshTokenInDoubt() {
        let old = RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r1"), sentAt: wall.addingTimeInterval(-60))
        makeMachine(inFlight: .record(old)) { $0.refreshTimeout = 10 }
        XCTAssertNil(machine.holdOff)
        XCTAssertEqual(timers[.proactive].map { $0 - monotonic }, 3600, "at expiry, not skew-early: the refresh token may be rotated")
        XCTAssertEqual(unauthorized(1), .hold, "a need presents it once more")
    }

    func testARecordAnotherProcessLeftIsHonouredUnderTheLock() {
        makeMachine { $0.refreshTimeout = 10; $0.backoffSeconds = 1 }
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        // It presented r1 a second ago and was killed; its lock went with it.
        let theirs = RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r1"), sentAt: wall.addingTimeInterval(-1))
        record(machine.lockAcquired(store: .tokens(machine.tokens), inFlight: .record(theirs), now: now))
        XCTAssertEqual(presentations, 0)
        XCTAssertEqual(recordsWritten, [])
        XCTAssertEqual(removals, 0)
        XCTAssertTrue(actions.contains(.releaseLock))
        XCTAssertEqual(machine.state, .ready)
        XCTAssertEqual(releases.count, 1, "held requests are answered")
        XCTAssertEqual(timers[.holdOff], monotonic + 10)
    }

    func testAWallClockThatJumpedDoesNotStretchTheHoldOff() {
        let future = RefreshInFlightRecord(fingerprint: TokenFingerprint.of("r1"), sentAt: wall.addingTimeInterval(86_400 * 365))
        makeMachine(inFlight: .record(future)) { $0.refreshTimeout = 10; $0.backoffSeconds = 1 }
        XCTAssertEqual(timers[.holdOff], monotonic + 11)
    }

    func testAnUnreadableRecordCountsAsARefreshSentWhenTheFileWasWritten() {
        makeMachine(inFlight: .unreadable("in-flight refresh marker x: expected …", writtenAt: wall.addingTimeInterval(-5))) {
            $0.refreshTimeout = 10; $0.backoffSeconds = 1
        }
        XCTAssertEqual(timers[.holdOff], monotonic + 6)
        XCTAssertEqual(removals, 0)
    }

    func testClientCredentialsWriteNoRecord() {
        makeMachine(refreshToken: nil) { $0.needsRefreshToken = false }
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockAcquired(store: .tokens(machine.tokens), inFlight: RefreshInFlightRead.none, now: now))
        XCTAssertEqual(recordsWritten, [])
        XCTAssertEqual(presentations, 1)
        XCTAssertNil(machine.exchangeInFlight, "nothing to burn: nothing abandoned at exit")
    }

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
        XCTAssertEqual(unauthorized(2), .hold)
        XCTAssertEqual(machine.state, .ready, "no new cycle after shutdown")
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

    // MARK: - A shared store (fleet mode)

    private func makeFleetMachine(expiresIn: Double? = 3600) {
        makeMachine(expiresIn: expiresIn) { $0.sharedStore = true; $0.storeWriteTimeout = 1; $0.refreshTimeout = 10 }
    }

    private var latches: [String] { actions.compactMap { if case .latchLoginRequired(let reason) = $0 { return reason } else { return nil } } }

    func testTheRefreshTokenNeverLeavesUnderALockWithTooLittleLifeLeft() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockAcquired(store: .tokens(machine.tokens), lockValidUntil: monotonic + 10.5, now: now))
        XCTAssertEqual(presentations, 0, "10.5 s of lock cannot cover a 10 s refresh plus a 1 s write")
        XCTAssertTrue(actions.contains(.releaseLock))
        advance(2)
        record(machine.lockAcquired(store: .tokens(machine.tokens), lockValidUntil: monotonic + 11, now: now))
        XCTAssertEqual(presentations, 0, "a shared store's in-flight record is written before the refresh token leaves")
        record(machine.inFlightRecorded(now: now))
        XCTAssertEqual(presentations, 1)
    }

    /// A lock taken before a reload that lengthened refresh_seconds keeps its shorter life, while the
    /// exchange, starting after the reload, runs with the longer bound: the lock must cover that one.
    func testALockTakenBeforeAReloadMustCoverTheReloadedRefreshTimeout() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)  // the cycle (refresh 10 s) asks for the lock
        var reloaded = machine.settings
        reloaded.refreshTimeout = 30
        record(machine.apply(reloaded, now: now))
        record(machine.lockAcquired(store: .tokens(machine.tokens), lockValidUntil: monotonic + 15, now: now))
        XCTAssertEqual(presentations, 0, "15 s of lock covers the cycle's 10 s, not the 30 s the exchange would now run with")
        XCTAssertTrue(actions.contains(.releaseLock))
        advance(2)
        record(machine.lockAcquired(store: .tokens(machine.tokens), lockValidUntil: monotonic + 31, now: now))
        XCTAssertEqual(presentations, 0, "a shared store's in-flight record is written before the refresh token leaves")
        record(machine.inFlightRecorded(now: now))
        XCTAssertEqual(presentations, 1, "a lock with the reloaded life is enough")
    }

    func testAWaitingRelayAdoptsAPublishedVersionWithoutPresentingAnything() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)  // now waiting for the lock another relay holds
        record(machine.storeRead(.tokens(TokenSet(accessToken: "a-fleet", refreshToken: "r-fleet")), now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertEqual(presentations, 0)
        XCTAssertTrue(actions.contains(.releaseLock), "the lock wait is given up")
        XCTAssertEqual(admit(), .send(generation: 2))
        // The lock arriving late is let go at once.
        record(machine.lockAcquired(store: .tokens(machine.tokens), lockValidUntil: monotonic + 100, now: now))
        XCTAssertEqual(presentations, 0)
    }

    /// Persist before release, fleet form: a failed write keeps the cycle open and the requests held
    /// (their hold timeout answers them), and the same tokens are written again until acknowledged.
    func testHeldRequestsWaitForTheSharedStoresAcknowledgement() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        XCTAssertEqual(writes.map(\.refreshToken), ["r2"])
        record(machine.persistFailed("Redis did not answer", now: now))
        XCTAssertEqual(releases, [], "nothing released before the store acknowledged")
        XCTAssertEqual(machine.state, .refreshing)
        XCTAssertEqual(unauthorized(1), .hold, "a new 401 joins the held requests")
        advance(5)
        XCTAssertEqual(writes.map(\.refreshToken), ["r2", "r2"], "the same write is sent again after the backoff")
        record(machine.persistFailed("Redis did not answer", now: now))
        record(machine.storeUnreachable("timed out", now: now))
        record(machine.storeReachable(now: now))
        XCTAssertEqual(writes.map(\.refreshToken), ["r2", "r2", "r2"], "and at once when the store is back")
        record(machine.persisted(now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertEqual(presentations, 1)
        XCTAssertNil(machine.unsaved)
        advance(60)
        XCTAssertEqual(writes.count, 3, "no write after the acknowledgement")
    }

    /// The store acknowledged only after the new token had expired (a failover longer than a short token
    /// lives): the held requests are not released with a dead token (each would get the API's 401 after
    /// its one replay); one more refresh under the lock, then they are.
    func testATokenThatExpiredWhileItsWriteWaitedIsRefreshedBeforeTheRelease() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2", expiresIn: 2))
        record(machine.persistFailed("Redis did not answer", now: now))
        advance(3)
        XCTAssertEqual(writes.map(\.refreshToken), ["r2", "r2"], "written again after the backoff")
        record(machine.persisted(now: now))
        XCTAssertEqual(releases, [], "not released with a token that expired while the write waited")
        XCTAssertEqual(machine.state, .refreshing)
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 2, "the saved refresh token is presented once more")
        answer(grant("a3", "r3"))
        record(machine.persisted(now: now))
        XCTAssertEqual(releases, [.renewed(generation: 3)])
        XCTAssertEqual(machine.tokens.accessToken, "a3")
    }

    /// A write acknowledged at once is released as always, however short the token.
    func testAShortTokenSavedAtOnceIsReleased() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2", expiresIn: 0.01), after: 0.05)
        advance(0.02)
        record(machine.persisted(now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)], "only a write that waited for the store is held back")
    }

    func testATokenFileSealedWithAKeyWeLackStopsThePresentationAndTheWrite() {
        makeMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        lockAcquired(store: .sealedUnopened("sealed with key id 0123456789abcdef"))
        XCTAssertEqual(presentations, 0, "another process may have sealed a newer rotation: our refresh token could be reuse")
        XCTAssertTrue(writes.isEmpty, "the sealed file is left as it is")
    }

    func testAnUnreadableSharedStoreUnderTheLockStopsThePresentation() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.lockAcquired(store: .unreadable("connection reset"), lockValidUntil: monotonic + 100, now: now))
        XCTAssertEqual(presentations, 0, "the fleet may have rotated: our refresh token unseen could be reuse")
    }

    func testAStaleWriterLosesItsCompareAndSetAndAdoptsTheStoredVersion() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a-ours", "r-ours"))
        record(machine.persistConflicted(.tokens(TokenSet(accessToken: "a-newer", refreshToken: "r-newer")), now: now))
        XCTAssertEqual(machine.tokens.accessToken, "a-newer")
        XCTAssertEqual(releases, [.renewed(generation: 2)])
        XCTAssertTrue(actions.contains(.count(.storeConflict)))
        XCTAssertEqual(machine.state, .ready)
        XCTAssertFalse(machine.isTalkingToTokenEndpoint)
    }

    func testWithTheStoreOutOfReachNothingIsRefreshedAndADeadTokenGets503() {
        makeFleetMachine(expiresIn: 100)
        record(machine.storeUnreachable("connection refused", now: now))
        XCTAssertEqual(admit(), .send(generation: 1), "a valid token keeps serving")
        XCTAssertEqual(unauthorized(1), .unavailable(retryAfter: Machine.storeOutageRetryAfter), "a 401: no refresh alone")
        XCTAssertEqual(admit(), .unavailable(retryAfter: Machine.storeOutageRetryAfter))
        advance(200)
        XCTAssertFalse(actions.contains { if case .acquireLock = $0 { return true } else { return false } }, "not even the proactive timer")
        XCTAssertTrue(machine.degradedReason?.contains("token store unreachable") ?? false)
        record(machine.storeReachable(now: now))
        XCTAssertTrue(actions.contains(.readStore), "the store is read first once back")
        record(machine.storeRead(.tokens(machine.tokens), now: now))
        advance(0)
        XCTAssertEqual(machine.state, .refreshing, "nothing new: the dead token is replaced now")
        attemptReachesTokenEndpoint()
        XCTAssertEqual(presentations, 1)
    }

    func testAnOutageEndsACycleThatHasNotReachedTheTokenServer() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        advance(0)
        record(machine.storeUnreachable("timed out", now: now))
        XCTAssertEqual(releases.count, 1)
        guard case .unavailable(let reason)? = releases.first else { return XCTFail("held requests must get an answer") }
        XCTAssertTrue(reason.contains("token store unreachable"), reason)
        XCTAssertTrue(actions.contains(.releaseLock))
    }

    func testARejectionLatchesLoginRequiredInTheStoreAndALatchedStoreStopsTheOthers() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(.rejected(status: 400, oauthError: "invalid_grant"))
        XCTAssertEqual(latches.count, 1, "stored for the fleet")

        makeFleetMachine()
        actions = []
        record(machine.storeRead(.latched(machine.tokens, reason: "refresh rejected"), now: now))
        XCTAssertEqual(machine.state, .loginRequired)
        XCTAssertEqual(latches, [], "a latch read from the store is not written back")
        XCTAssertEqual(admit(), .loginRequired)
        record(machine.storeRead(.tokens(TokenSet(accessToken: "a-imported", refreshToken: "r-imported")), now: now))
        XCTAssertEqual(machine.state, .ready, "new tokens (an import, a login) clear it")
    }

    func testALostCompareAndSetToNothingNewerKeepsTheFreshTokensAndWritesAgain() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a-ours", "r-ours"))
        // The store holds our own old tokens (r1, presented already): nothing newer than what we got.
        record(machine.persistConflicted(.tokens(TokenSet(accessToken: "a1", refreshToken: "r1")), now: now))
        XCTAssertEqual(releases, [], "held until the store acknowledges")
        XCTAssertNotNil(machine.unsaved, "visible, and the write is retried")
        advance(1)
        XCTAssertEqual(writes.last?.refreshToken, "r-ours", "the only live refresh token is kept and written again")
        record(machine.persisted(now: now))
        XCTAssertEqual(machine.tokens.refreshToken, "r-ours")
        XCTAssertEqual(releases, [.renewed(generation: 2)])
    }

    func testUnsavedTokensAreWrittenTheMomentTheStoreIsBack() {
        makeFleetMachine()
        XCTAssertEqual(unauthorized(1), .hold)
        attemptReachesTokenEndpoint()
        answer(grant("a2", "r2"))
        record(machine.storeUnreachable("connection reset", now: now))
        record(machine.persistFailed("Redis is not connected", now: now))
        XCTAssertEqual(releases, [], "held until the store acknowledges")
        let writesBefore = writes.count
        advance(0.01)
        record(machine.storeReachable(now: now))
        XCTAssertEqual(writes.count, writesBefore + 1, "written at once, not after the backoff")
        XCTAssertEqual(writes.last?.refreshToken, "r2")
        record(machine.persisted(now: now))
        XCTAssertEqual(releases, [.renewed(generation: 2)])
    }
}
