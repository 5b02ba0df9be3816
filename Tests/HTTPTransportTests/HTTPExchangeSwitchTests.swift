import Foundation
import HTTPTransport
import XCTest

/// A one-shot request never asks to switch protocols, so a `101 Switching Protocols` answer is a broken
/// response, named at once. Found by the black-box probe: a token endpoint answering 101 left the refresh
/// waiting for an end that could never come, until `timeouts.refresh_seconds`, and the log said "timed out".
final class HTTPExchangeSwitchTests: LoopThreadTestCase {
    func testAnUnaskedSwitchingProtocolsFailsAtOnceAndSaysSo() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n{}")
        defer { upstream.stop() }
        let outcome = DispatchSemaphore(value: 0)
        let box = ResultBox<Result<HTTPExchange.Response, HTTPExchange.Failure>>()
        let loop = loopThread.loop
        let request = HTTPExchange.Request(host: "127.0.0.1", port: upstream.port, tls: nil, method: "POST", target: "/token",
                                           fields: [("Host", "127.0.0.1")], body: Array("grant_type=x".utf8))
        let exchange = loopThread.sync {
            HTTPExchange(loop: loop, request: request, limits: HTTPExchange.Limits(timeoutSeconds: 30)) { result in
                box.value = result
                outcome.signal()
            }
        }
        // Well inside the 30-second deadline: the failure must not be a timeout.
        XCTAssertEqual(outcome.wait(timeout: .now() + 10), .success, "no outcome within 10 s")
        loopThread.sync { withExtendedLifetime(exchange) {} }
        guard case .failure(let failure)? = loopThread.sync({ box.value }) else {
            return XCTFail("expected a failure, got \(String(describing: loopThread.sync { box.value }))")
        }
        XCTAssertEqual(failure.description, "invalid HTTP response: 101 Switching Protocols to a request that did not ask for an upgrade")
        XCTAssertTrue(failure.requestMayHaveReachedPeer)
    }
}
