import XCTest
@testable import TokenRelay

/// The request lifecycle in-process: events in, actions out, time passed by hand. No sockets.
final class RequestLifecycleTests: XCTestCase {
    typealias Machine = RequestLifecycle
    private let settings = Machine.Settings(idempotent: true, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5)
    private let token1 = Machine.Admission.send(generation: 1, authorization: "Bearer one")
    private let token2 = Machine.Admission.send(generation: 2, authorization: "Bearer two")

    private func lost(started: Bool = false) -> Machine.UpstreamFailure {
        .init(kind: .connectionLost, responseStarted: started, description: "connection closed before a response")
    }

    /// The summary `finish` reports, when `actions` end with it.
    private func summary(_ actions: Machine.ActionList, of machine: Machine) -> Machine.Summary? {
        guard actions.last == .finish else { return nil }
        return machine.summary
    }

    /// Sent and answered without trouble.
    func testAPlainRequestIsSentRelayedAndFinished() {
        var machine = Machine(settings: settings)
        XCTAssertEqual(machine.start(admission: token1, now: 0), [.acquireConnection(admittedEarlier: false)])
        // No pool wait was scheduled (a connection at once), so none is cancelled.
        XCTAssertEqual(machine.connectionAcquired(reused: false, admission: token1, now: 0), [
            .send(.token(generation: 1)),
            .schedule(.responseHead, after: 30), .schedule(.connect, after: 5),
        ])
        XCTAssertEqual(machine.connected(), [.cancel(.connect)])
        // The connect deadline was cancelled when the connection came up.
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false), [.cancel(.responseHead), .relayResponse])
        let end = machine.responseEnded(now: 1)
        XCTAssertEqual(Array(end.prefix(2)), [.releaseConnection, .endRelayedResponse])
        XCTAssertEqual(summary(end, of: machine), Machine.Summary(status: 200, attempts: 1, generation: 1))
        XCTAssertTrue(machine.isFinished)
    }

    /// A reused keep-alive connection is established already: no connect deadline.
    func testAReusedConnectionGetsNoConnectDeadline() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        XCTAssertFalse(machine.connectionAcquired(reused: true, admission: token1, now: 0).contains(.schedule(.connect, after: 5)))
    }

    /// The 401 answered a token that was replaced meanwhile: sent again at once, without a refresh.
    func testA401ToAStaleTokenIsReplayedWithoutARefresh() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .captureResponse)
        XCTAssertEqual(machine.responseEnded(now: 1), [.cancel(.responseHead), .releaseConnection, .consultRefreshRules(sentGeneration: 1)])
        XCTAssertEqual(machine.refreshRulesDecided(.replay, now: 1), [.countReplay(.staleGeneration), .acquireConnection(admittedEarlier: false)])
        XCTAssertEqual(machine.connectionAcquired(reused: true, admission: token2, now: 1).first, .send(.token(generation: 2)))
        // The replay's own 401 goes to the client: a request is replayed at most once.
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .relayResponse)
        XCTAssertEqual(summary(machine.responseEnded(now: 2), of: machine), Machine.Summary(status: 401, attempts: 2, generation: 2))
    }

    /// The 401 starts (or joins) a refresh: held, then replayed with the new token.
    func testA401IsHeldForTheRefreshAndReplayedAfterIt() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        _ = machine.responseHead(status: 401, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 1)
        XCTAssertEqual(machine.refreshRulesDecided(.hold, now: 1), [.hold, .schedule(.hold, after: 10)])
        XCTAssertEqual(machine.refreshFinished(.renewed(generation: 2), now: 3), [
            .cancel(.hold), .unhold, .countReplay(.afterRefresh), .acquireConnection(admittedEarlier: true),
        ])
        _ = machine.connectionAcquired(reused: true, admission: token2, now: 3)
        _ = machine.responseHead(status: 200, indicatesExpiredToken: false)
        let done = summary(machine.responseEnded(now: 4), of: machine)
        XCTAssertEqual(done?.status, 200)
        XCTAssertEqual(done?.hold?.outcome, .replayed)
        XCTAssertEqual(done?.hold?.seconds, 3)
    }

    /// The refresh token was rejected: the client gets the upstream's own 401, as if tokenrelay were absent.
    func testARejectedRefreshAnswersTheCaptured401() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        _ = machine.responseHead(status: 401, indicatesExpiredToken: true)
        _ = machine.responseEnded(now: 0)
        _ = machine.refreshRulesDecided(.hold, now: 0)
        let actions = machine.refreshFinished(.rejected, now: 1)
        XCTAssertEqual(Array(actions.prefix(3)), [.cancel(.hold), .unhold, .respondCaptured])
        XCTAssertEqual(summary(actions, of: machine)?.status, 401)
        XCTAssertEqual(summary(actions, of: machine)?.hold?.outcome, .unauthorized)
    }

    /// Held at arrival (never sent) and the refresh is rejected: tokenrelay's own "login required".
    func testAHeldArrivalGetsLoginRequiredWhenTheRefreshIsRejected() {
        var machine = Machine(settings: settings)
        XCTAssertEqual(machine.start(admission: .hold, now: 0), [.hold, .schedule(.hold, after: 10)])
        let rejected = machine.refreshFinished(.rejected, now: 1)
        XCTAssertEqual(rejected[2], .respond)
        XCTAssertEqual(rejected.answer, .loginRequired)
    }

    /// A request that waited in the pool's queue cancels that deadline when its connection comes; one
    /// whose connect was never reported up cancels the connect deadline when the answer comes.
    func testDeadlinesThatWereSetAreCancelled() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        XCTAssertEqual(machine.connectionQueued(), [.schedule(.poolWait, after: settings.poolWaitSeconds)])
        XCTAssertEqual(machine.connectionAcquired(reused: false, admission: token1, now: 1).first, .cancel(.poolWait))
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false), [.cancel(.connect), .cancel(.responseHead), .relayResponse])
    }

    /// The hold deadline runs from the first hold: held, released, and held again by the next refresh,
    /// a request waits only what is left of its first deadline.
    func testASecondHoldKeepsTheFirstDeadline() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: .hold, now: 0)
        _ = machine.refreshFinished(.renewed(generation: 2), now: 4)
        let actions = machine.connectionAcquired(reused: true, admission: .hold, now: 4)
        XCTAssertEqual(actions, [.cancel(.poolWait), .releaseConnection, .hold, .schedule(.hold, after: 6)])
        let timedOut = machine.timerFired(.hold, now: 10)
        XCTAssertEqual(timedOut[0], .unhold)
        XCTAssertEqual(timedOut[1], .respond)
        XCTAssertEqual(timedOut.answer, .unavailable("timed out waiting for a token refresh"))
        XCTAssertEqual(summary(timedOut, of: machine)?.hold?.outcome, .unavailable)
    }

    /// The list of held requests is full: 503 at once, and the request never counts as held.
    func testAFullHoldListAnswers503() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: .hold, now: 0)
        let actions = machine.holdRefused(now: 0)
        XCTAssertEqual(actions[1], .respond)
        XCTAssertEqual(actions.answer, .tooManyHeld)
        XCTAssertNil(summary(actions, of: machine)?.hold)
    }

    /// The keep-alive race: the upstream closed an idle connection just as an idempotent request went out
    /// on it. Sent once more, on a fresh connection; a second failure is the client's 502.
    func testAnIdempotentRequestLostOnAReusedConnectionIsRetriedOnce() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        let lostOnce = machine.upstreamFailed(lost(), now: 0)
        XCTAssertEqual(Array(lostOnce), [.cancel(.connect), .cancel(.responseHead), .retrying, .acquireFreshConnection])
        XCTAssertEqual(lostOnce.failure, lost())
        _ = machine.connectionAcquired(reused: false, admission: token1, now: 0)
        let failed = machine.upstreamFailed(lost(), now: 1)
        XCTAssertTrue(failed.contains(.respond))
        XCTAssertEqual(failed.answer, .badGateway("upstream connection closed before a response"))
        XCTAssertEqual(summary(failed, of: machine)?.attempts, 1)
    }

    /// A POST whose bytes went out may have been acted on: never sent twice.
    func testANonIdempotentRequestIsNotRetriedAfterItsBytesWentOut() {
        var machine = Machine(settings: .init(idempotent: false, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5))
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        XCTAssertFalse(machine.upstreamFailed(lost(), now: 0).contains(.acquireFreshConnection))
    }

    /// A connection that never connected cannot have delivered anything: any method is retried.
    func testAConnectFailureIsRetriedForAnyMethod() {
        var machine = Machine(settings: .init(idempotent: false, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5))
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: false, admission: token1, now: 0)
        let failure = Machine.UpstreamFailure(kind: .connect, responseStarted: false, description: "could not connect")
        XCTAssertEqual(machine.upstreamFailed(failure, now: 0).last, .acquireFreshConnection)
    }

    /// No complete head in time: 504, and the connection is closed (never reused with half a head in it).
    func testAResponseHeadDeadlineAnswers504() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        let actions = machine.timerFired(.responseHead, now: 30)
        XCTAssertEqual(Array(actions.prefix(3)), [.cancel(.connect), .cancelUpstream, .releaseConnection])
        XCTAssertTrue(actions.contains(.respond))
        XCTAssertEqual(actions.answer, .gatewayTimeout)
        XCTAssertEqual(summary(actions, of: machine)?.status, 504)
    }

    /// The upstream died mid-body: the client sees a truncated response, never a clean end.
    func testAFailureWhileRelayingCutsTheClient() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        _ = machine.responseHead(status: 200, indicatesExpiredToken: false)
        let actions = machine.upstreamFailed(lost(started: true), now: 1)
        XCTAssertEqual(Array(actions.prefix(3)), [.releaseConnection, .upstreamFailed, .abortClient(flushFirst: true)])
        XCTAssertEqual(actions.failure, lost(started: true))
        XCTAssertEqual(summary(actions, of: machine)?.status, 200)
    }

    /// The client hung up while its request was held: taken off the list, nothing answered.
    func testAClientGoneWhileHeldIsUnheld() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: .hold, now: 0)
        let actions = machine.clientGone(now: 2)
        XCTAssertEqual(Array(actions.prefix(2)), [.cancelUpstream, .unhold])
        XCTAssertEqual(summary(actions, of: machine)?.status, 499, "logged and counted as nginx does")
        XCTAssertEqual(summary(actions, of: machine)?.hold?.outcome, .clientGone)
        XCTAssertEqual(machine.refreshFinished(.renewed(generation: 2), now: 3), [])
    }

    /// Passthrough paths: nothing injected, and their 401 is the client's business.
    func testAPassthroughRequestCarriesNoTokenAndIsNeverHeld() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: nil, now: 0)
        XCTAssertEqual(machine.connectionAcquired(reused: true, admission: nil, now: 0).first, .send(.none))
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .relayResponse)
    }

    /// A streamed upload cannot be sent twice: once its body started to leave, a 401 is the client's.
    func testA401AfterAStreamedBodyLeftIsPassedThrough() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        machine.streamedBodyStarted()
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .relayResponse)
    }

    /// Each piece of a streamed upload moves the response-head deadline: the upload may take its time,
    /// and the deadline counts from the last piece. The body is then spent: a 401 goes to the client.
    func testAStreamedBodyMovesTheResponseDeadlineAndIsNotReplayedAfterIt() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: false, admission: token1, now: 0)
        XCTAssertEqual(machine.streamedBodyProgressed(), [.schedule(.responseHead, after: 30)])
        XCTAssertEqual(machine.streamedBodyProgressed(), [.schedule(.responseHead, after: 30)])
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true),
                       [.reportUnreplayableRefreshTrigger(sentGeneration: 1), .cancel(.connect), .cancel(.responseHead), .relayResponse],
                       "the 401 is the client's, and the refresh rules still hear of it")
        // A piece that leaves while the answer is relayed (an early answer) changes no deadline.
        XCTAssertEqual(machine.streamedBodyProgressed(), [])
        XCTAssertEqual(summary(machine.responseEnded(now: 1), of: machine), Machine.Summary(status: 401, attempts: 1, generation: 1))
    }

    /// Only a refresh-triggering answer to the first send is reported: a 401 that is not about the token,
    /// or one to a passthrough request, is nobody's business but the client's.
    func testOnlyAnExpiredTokenAnswerToAnUnreplayableBodyIsReported() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: false, admission: token1, now: 0)
        _ = machine.streamedBodyProgressed()
        XCTAssertEqual(machine.responseHead(status: 403, indicatesExpiredToken: false), [.cancel(.connect), .cancel(.responseHead), .relayResponse])
    }

    /// A 401 that came before any byte of a streamed body left costs nothing to replay: captured, held
    /// for the refresh, sent again (the driver holds the body for `100 Continue` again).
    func testA401BeforeAStreamedBodyLeftIsHeldAndReplayed() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: false, admission: token1, now: 0)
        XCTAssertEqual(machine.responseHead(status: 401, indicatesExpiredToken: true).last, .captureResponse)
        XCTAssertEqual(machine.responseEnded(now: 1), [.cancel(.responseHead), .releaseConnection, .consultRefreshRules(sentGeneration: 1)])
        XCTAssertEqual(machine.refreshRulesDecided(.hold, now: 1), [.hold, .schedule(.hold, after: 10)])
        XCTAssertEqual(machine.refreshFinished(.renewed(generation: 2), now: 2).last, .acquireConnection(admittedEarlier: true))
        XCTAssertEqual(machine.connectionAcquired(reused: false, admission: token2, now: 2).first, .send(.token(generation: 2)))
        XCTAssertEqual(machine.streamedBodyProgressed(), [.schedule(.responseHead, after: 30)])
        _ = machine.responseHead(status: 200, indicatesExpiredToken: false)
        XCTAssertEqual(summary(machine.responseEnded(now: 3), of: machine)?.attempts, 2)
    }

    /// A connection lost under a streamed body that had started to leave is never retried, whatever the
    /// method: the rest of the body was read from the client and is gone.
    func testAStreamedBodyIsNotRetriedAfterItsBytesLeft() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        _ = machine.streamedBodyProgressed()
        let failed = machine.upstreamFailed(lost(), now: 1)
        XCTAssertFalse(failed.contains(.acquireFreshConnection))
        XCTAssertEqual(summary(failed, of: machine)?.status, 502)
    }

    /// Before any byte left, a lost reused connection is retried as for a kept body.
    func testAStreamedBodyIsRetriedWhenNoByteLeft() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: token1, now: 0)
        XCTAssertEqual(machine.upstreamFailed(lost(), now: 1).last, .acquireFreshConnection)
    }

    /// A stalled upstream turns queued requests into quick 503s.
    func testAQueuedRequestGivesUpAfterThePoolWait() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: token1, now: 0)
        XCTAssertEqual(machine.connectionQueued(), [.schedule(.poolWait, after: 2)])
        let actions = machine.timerFired(.poolWait, now: 2)
        XCTAssertEqual(actions.first, .cancelConnectionWait)
        XCTAssertEqual(summary(actions, of: machine)?.status, 503)
        // A connection granted after the answer goes straight back.
        XCTAssertEqual(machine.connectionAcquired(reused: true, admission: token1, now: 3), [.releaseConnection])
    }

    /// The refresh rules' hold-off: no refresh may start, so no wait either.
    func testTheRefreshHoldOffAnswers503WithRetryAfter() {
        var machine = Machine(settings: settings)
        let actions = machine.start(admission: .unavailable(retryAfter: 7), now: 0)
        XCTAssertEqual(actions.first, .respond)
        XCTAssertEqual(actions.answer, .refreshOnHold(retryAfter: 7))
    }

    /// Shutdown: a held request gets 503, a relayed one is cut.
    func testAbandonAnswersHeldAndCutsRelayed() {
        var held = Machine(settings: settings)
        _ = held.start(admission: .hold, now: 0)
        let shutDown = held.abandon(now: 1)
        XCTAssertEqual(shutDown[2], .respond)
        XCTAssertEqual(shutDown.answer, .unavailable("tokenrelay is shutting down"))
        var relaying = Machine(settings: settings)
        _ = relaying.start(admission: token1, now: 0)
        _ = relaying.connectionAcquired(reused: true, admission: token1, now: 0)
        _ = relaying.responseHead(status: 200, indicatesExpiredToken: false)
        XCTAssertEqual(Array(relaying.abandon(now: 1).prefix(2)), [.cancelUpstream, .abortClient(flushFirst: false)])
    }

    /// Nothing happens twice: every event after the end yields nothing.
    func testAFinishedRequestIgnoresLateEvents() {
        var machine = Machine(settings: settings)
        _ = machine.start(admission: .loginRequired, now: 0)
        XCTAssertTrue(machine.isFinished)
        XCTAssertEqual(machine.timerFired(.hold, now: 1), [])
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false), [])
        XCTAssertEqual(machine.upstreamFailed(lost(), now: 1), [])
        XCTAssertEqual(machine.clientGone(now: 1), [])
        XCTAssertEqual(machine.abandon(now: 1), [])
    }
}
