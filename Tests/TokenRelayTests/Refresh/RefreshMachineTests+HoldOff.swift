import Foundation
import XCTest
@testable import TokenRelay

/// The hold-off after an unknown outcome, and the in-flight record that carries it across restarts and
/// processes (see `RefreshMachineTests.swift` for the harness).
extension RefreshMachineTests {
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
}
