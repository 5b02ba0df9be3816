import Foundation
import XCTest
@testable import TokenRelay

/// A shared store (fleet mode): lock lifetimes, published versions, acknowledgements, compare-and-set and
/// outages (see `RefreshMachineTests.swift` for the harness).
extension RefreshMachineTests {
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
