import XCTest
@testable import TokenRelay

/// gRPC's UNAUTHENTICATED before any response message, in the request machine: events in, actions out,
/// time passed by hand. The status field's reading is `GRPCRefreshTriggerTests`' part.
final class RequestLifecycleGRPCTests: XCTestCase {
    typealias Machine = RequestLifecycle
    private let settings = Machine.Settings(idempotent: false, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5)
    private let token1 = Machine.Admission.send(generation: 1, authorization: "Bearer one")
    private let token2 = Machine.Admission.send(generation: 2, authorization: "Bearer two")

    /// A machine whose first send (generation 1) is awaiting its answer.
    private func sent() -> Machine {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        return machine
    }

    private func summary(_ actions: Machine.ActionList, of machine: Machine) -> Machine.Summary? {
        actions.last == .finish ? machine.summary : nil
    }

    /// A Trailers-Only UNAUTHENTICATED to a kept body: captured, held for the one refresh, replayed once on a
    /// fresh stream with the new token; the replay's answer is relayed as it comes (its head not withheld).
    func testAnUnauthenticatedBeforeAnyMessageIsHeldAndReplayedOnce() {
        var machine = sent()
        XCTAssertTrue(machine.withholdsGRPCResponseHead, "the first send's head waits for a message or the end")
        XCTAssertEqual(machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true),
                       [.cancel(.connect), .schedule(.responseHead, after: 30), .captureResponse])
        XCTAssertEqual(machine.responseEnded(now: 1), [.cancel(.responseHead), .releaseConnection, .consultRefreshRules(sentGeneration: 1)])
        XCTAssertEqual(machine.refreshRulesDecided(.hold, now: 1), [.hold, .schedule(.hold, after: 10)])
        XCTAssertEqual(machine.refreshFinished(.renewed(generation: 2), now: 4), [
            .cancel(.hold), .unhold, .countReplay(.afterRefresh), .acquireConnection(admittedEarlier: true),
        ])
        XCTAssertEqual(machine.connectionAcquired(reused: true, admission: token2, now: 4).first, .send(.token(generation: 2)))
        XCTAssertFalse(machine.withholdsGRPCResponseHead, "a replay's status is the client's: nothing to wait for")
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false), [.cancel(.responseHead), .relayResponse])
        let done = summary(machine.responseEnded(now: 5), of: machine)
        XCTAssertEqual(done?.status, 200)
        XCTAssertEqual(done?.attempts, 2)
        XCTAssertEqual(done?.hold?.outcome, .replayed)
        XCTAssertEqual(done?.hold?.seconds, 4)
    }

    /// The replay-once guard: a second UNAUTHENTICATED, to the replay, goes to the client unchanged.
    func testASecondUnauthenticatedAfterTheReplayIsTheClients() {
        var machine = sent()
        _ = machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 1)
        XCTAssertEqual(machine.refreshRulesDecided(.replay, now: 1), [.countReplay(.staleGeneration), .acquireConnection(admittedEarlier: false)])
        _ = machine.connectionAcquired(reused: true, admission: token2, now: 1)
        XCTAssertEqual(machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true), [.cancel(.responseHead), .relayResponse])
        let done = summary(machine.responseEnded(now: 2), of: machine)
        XCTAssertEqual(done, Machine.Summary(status: 200, attempts: 2, generation: 2))
    }

    /// The refresh was rejected: the client gets the upstream's own UNAUTHENTICATED (the captured answer),
    /// and the hold ends as "unauthorized" although its HTTP status is 200.
    func testARejectedRefreshAnswersTheCapturedStatus() {
        var machine = sent()
        _ = machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 0)
        _ = machine.refreshRulesDecided(.hold, now: 0)
        let actions = machine.refreshFinished(.rejected, now: 2)
        XCTAssertEqual(Array(actions.prefix(3)), [.cancel(.hold), .unhold, .respondCaptured])
        XCTAssertEqual(summary(actions, of: machine)?.status, 200)
        XCTAssertEqual(summary(actions, of: machine)?.hold?.outcome, .unauthorized)
    }

    /// Held for a refresh that does not end in time: 503 at the hold deadline (scheduled 10 s after the
    /// hold began at 1), and the hold lasted exactly that long on the injected clock.
    func testAHeldCallGets503AtTheHoldDeadline() {
        var machine = sent()
        _ = machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 1)
        _ = machine.refreshRulesDecided(.hold, now: 1)
        XCTAssertEqual(machine.timerFired(.responseHead, now: 10.5), [], "held: no answer is awaited")
        let expired = machine.timerFired(.hold, now: 11)
        XCTAssertEqual(expired.answer?.status, 503)
        XCTAssertEqual(summary(expired, of: machine)?.hold?.outcome, .unavailable)
        XCTAssertEqual(summary(expired, of: machine)?.hold?.seconds, 10)
    }

    /// A streamed request body that has started to leave cannot be sent again: the status is the client's,
    /// its head is not withheld, and the refresh rules still hear that the token is dead.
    func testAStreamedBodyGetsItsStatusAndTheRefreshRulesHearOfIt() {
        var machine = sent()
        _ = machine.streamedBodyProgressed()
        XCTAssertFalse(machine.withholdsGRPCResponseHead)
        XCTAssertEqual(machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true),
                       [.reportUnreplayableRefreshTrigger(sentGeneration: 1), .cancel(.responseHead), .relayResponse])
    }

    /// A status that is not a trigger (NOT_FOUND, say) is relayed; so is any status to a passthrough request.
    func testOtherStatusesAndPassthroughRequestsAreRelayed() {
        var machine = sent()
        XCTAssertEqual(machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: false), [.cancel(.responseHead), .relayResponse])
        var passthrough = Machine(settings: settings)
        _ = passthrough.start(admission: nil, now: 0)
        _ = passthrough.connectionAcquired(reused: true, admission: nil, now: 0)
        XCTAssertFalse(passthrough.withholdsGRPCResponseHead)
        XCTAssertEqual(passthrough.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true), [.cancel(.responseHead), .relayResponse])
    }

    /// A response message came first: the head went to the machine as any other and is relayed; a status at
    /// the end of that answer (in its trailers) never comes back to the machine as a refusal.
    func testAStatusAfterAMessageIsNeverCaptured() {
        var machine = sent()
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false), [.cancel(.responseHead), .relayResponse])
        XCTAssertEqual(machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true), [], "too late: ignored")
        XCTAssertEqual(summary(machine.responseEnded(now: 1), of: machine)?.attempts, 1)
    }

    /// The head is in but withheld: the head deadline gives way to the stream-idle one (a watch may wait long
    /// for its first message), and the connect deadline is done with; the answer then decides as ever.
    func testAWithheldHeadWaitsUnderTheStreamIdleDeadline() {
        var machine = Machine(settings: Machine.Settings(idempotent: false, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30,
                                                         connectSeconds: 5, streamIdleSeconds: 300))
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: false, admission: token1, now: 0)
        XCTAssertEqual(machine.responseHeadWithheld(), [.cancel(.connect), .schedule(.responseHead, after: 300)])
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false), [.cancel(.responseHead), .relayResponse])
        XCTAssertEqual(machine.responseHeadWithheld(), [], "relaying: nothing withheld any more")
        var silent = sent()
        _ = silent.responseHeadWithheld()
        let cut = silent.timerFired(.responseHead, now: 300)
        XCTAssertEqual(cut.answer?.status, 504, "nothing reached the client: it is told")
    }

    /// Before the send there is no answer to withhold, and after the refusal was captured nothing more is.
    func testTheHeadIsWithheldOnlyWhileAnAnswerIsAwaited() {
        var machine = Machine(settings: settings)
        XCTAssertFalse(machine.withholdsGRPCResponseHead)
        _ = machine.start(admission: token1, now: 0)
        XCTAssertFalse(machine.withholdsGRPCResponseHead)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        XCTAssertTrue(machine.withholdsGRPCResponseHead)
        _ = machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true)
        XCTAssertFalse(machine.withholdsGRPCResponseHead)
    }

    /// A replay whose send was captured and then failed before its answer: a later local answer is not
    /// counted as an unauthorized hold (the gRPC capture belonged to the earlier send).
    func testALocalAnswerAfterTheReplayIsNotCountedAsUnauthorized() {
        var machine = sent()
        _ = machine.grpcStatusBeforeMessage(status: 200, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 1)
        _ = machine.refreshRulesDecided(.hold, now: 1)
        _ = machine.refreshFinished(.renewed(generation: 2), now: 2)
        _ = machine.connectionAcquired(reused: true, admission: token2, now: 2)
        let failed = machine.timerFired(.responseHead, now: 40)
        XCTAssertEqual(summary(failed, of: machine)?.status, 504)
        XCTAssertEqual(summary(failed, of: machine)?.hold?.outcome, .other)
    }
}
