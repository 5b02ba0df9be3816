import Foundation
import XCTest
@testable import TokenRelay

/// An upstream response that breaks before any byte of it reached the client (its head waits to go out
/// with the first body piece, and that piece is malformed or never comes) is answered 502, not with a
/// silent close. Found by the black-box probe: a chunked response with a bad first chunk size, or an
/// oversized chunk extension, left the client with an empty reply and the access log with a 200.
final class UnsentResponseHeadTests: RelayTestCase {
    func testTheMachineAnswers502WhenNothingOfTheResponseLeft() {
        let settings = RequestLifecycle.Settings(idempotent: true, holdSeconds: 10, poolWaitSeconds: 2, upstreamSeconds: 30, connectSeconds: 5)
        let admission = RequestLifecycle.Admission.send(generation: 1, authorization: "Bearer one")
        var machine = RequestLifecycle(settings: settings)
        _ = machine.start(admission: admission, now: 0)
        _ = machine.connectionAcquired(reused: true, admission: admission, now: 0)
        XCTAssertEqual(machine.responseHead(status: 200, indicatesExpiredToken: false).last, .relayResponse)
        let failure = RequestLifecycle.UpstreamFailure(kind: .invalidResponse, responseStarted: true, description: "invalid HTTP response: malformed chunk size")
        let actions = machine.upstreamFailed(failure, responseUnsent: true, now: 1)
        XCTAssertFalse(actions.contains(.abortClient(flushFirst: true)))
        XCTAssertTrue(actions.contains(.respond), "\(actions)")
        XCTAssertEqual(actions.answer, .badGateway("upstream \(failure)"))
        guard actions.last == .finish, let summary = machine.summary else { return XCTFail("\(actions)") }
        XCTAssertEqual(summary.status, 502, "the access log says what the client got")
    }

    func testABrokenFirstChunkIsAnswered502() throws {
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                if request.path == "/broken" {
                    try connection.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n")
                    _ = connection.waitForPeerClose(timeout: 10)
                    return
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL]])
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/broken", timeout: 10)
        XCTAssertEqual(response.status, 502, response.bodyText)
        XCTAssertTrue(response.bodyText.contains("chunk"), response.bodyText)
        XCTAssertEqual(try get(relay, "/after").bodyText, "ok")
    }
}
