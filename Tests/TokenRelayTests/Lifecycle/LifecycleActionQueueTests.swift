import XCTest
@testable import TokenRelay

/// The inline action list and the queue the driver runs the machine's actions through.
final class LifecycleActionQueueTests: XCTestCase {
    typealias Action = RequestLifecycle.Action
    typealias ActionList = RequestLifecycle.ActionList

    func testListsLongerThanTheInlineSlotsKeepTheirOrder() {
        var list = ActionList(.cancel(.connect), .cancelUpstream, .releaseConnection)
        let timedOut = RequestLifecycle.UpstreamFailure(kind: .timeout, responseStarted: false, description: "timed out")
        list += ActionList(.upstreamFailed, .respond).reporting(timedOut).answering(.gatewayTimeout)
        list.append(.unhold)
        XCTAssertEqual(Array(list), [.cancel(.connect), .cancelUpstream, .releaseConnection,
                                     .upstreamFailed, .respond, .unhold])
        // What the actions name but do not carry comes along with the list.
        XCTAssertEqual(list.failure, timedOut)
        XCTAssertEqual(list.answer, .gatewayTimeout)
        XCTAssertEqual(list.count, 6)
        XCTAssertEqual(list.last, .unhold)
        XCTAssertNotEqual(list, [.cancel(.connect)])
        XCTAssertNotEqual(list, [.cancel(.connect), .cancelUpstream, .releaseConnection, .upstreamFailed, .respond, .unhold], "the payloads are part of the list")
        var taken = list
        XCTAssertEqual(taken.take(), list)
        XCTAssertTrue(taken.isEmpty)
        // Moved out one by one, inline slots and the overflow alike, in order.
        var consumed = list
        XCTAssertEqual((0..<list.count).map { consumed.take(at: $0) }, Array(list))
    }

    func testActionsQueuedDuringABatchRunAfterItInOrderAndNothingRunsAfterFinish() {
        var queue = LifecycleActionQueue()
        var performed: [Action] = []
        // What a driver does: an action that feeds the machine queues the new actions behind the batch.
        func execute(_ actions: ActionList) {
            guard queue.begin() else {
                var waiting = queue.takeWaiting()
                waiting += actions
                return queue.wait(&waiting)
            }
            func performEach(_ batch: ActionList) {
                for index in 0..<batch.count where queue.admits(batch[index]) {
                    performed.append(batch[index])
                    if case .acquireConnection = batch[index] {
                        execute(ActionList(.cancel(.poolWait), .send(.none), .schedule(.responseHead, after: 1)))
                        execute(ActionList(.finish, .unhold))
                    }
                }
            }
            performEach(actions)
            while let batch = queue.next() { performEach(batch) }
        }
        execute(ActionList(.acquireConnection(admittedEarlier: false), .hold))
        XCTAssertEqual(performed, [.acquireConnection(admittedEarlier: false), .hold, .cancel(.poolWait), .send(.none),
                                   .schedule(.responseHead, after: 1), .finish])
        XCTAssertTrue(queue.isFinished)
        execute(ActionList(.hold))
        XCTAssertEqual(performed.count, 6)
    }
}
