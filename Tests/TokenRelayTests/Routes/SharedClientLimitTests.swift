import Foundation
import XCTest

/// `limits.max_client_connections` bounds the main listener and every route's own listener together: the
/// main listener's rules at the limit (idle connections make room, newcomers wait over the limit, a request
/// with no slot gets 503 and the connection closes) apply across all of them.
final class SharedClientLimitTests: ReloadTestCase {
    private var payAPI: FakeAPIServer!

    /// A config with a route `pay` on its own listener (port 0), and the relay's port for it.
    private func startWithRouteListener(limit: Int) throws -> (TokenRelayProcess, Int) {
        payAPI = try secondAPI()
        let relay = try startRelay(["routes": [["name": "pay", "listen": "127.0.0.1:0", "upstream": ["url": payAPI.baseURL]]],
                                    "limits": ["max_client_connections": limit]])
        var port: Int?
        _ = waitUntil(timeout: 10) {
            for line in relay.stderrText.split(separator: "\n") where line.contains("route listening") && line.contains("route=pay") {
                guard let range = line.range(of: "proxy=127.0.0.1:") else { continue }
                port = Int(String(line[range.upperBound...].prefix { $0.isNumber }))
            }
            return port != nil
        }
        return (relay, try XCTUnwrap(port, "no 'route listening' line: \(relay.stderrText)"))
    }

    private func openConnections(_ relay: TokenRelayProcess) -> Int? {
        (try? admin(relay, "/status"))?.json()?["client_connections"] as? Int
    }

    /// Holds the main upstream's answers to /busy until the gate is signalled (bounded).
    private func busyGate() -> DispatchSemaphore {
        let gate = DispatchSemaphore(value: 0)
        api.responseOverride = { request in
            if request.path == "/busy" { _ = gate.wait(timeout: .now() + 15) }
            return nil
        }
        return gate
    }

    /// `count` requests to /busy on the main listener, each on its own connection, in flight when this returns.
    private func busyRequests(_ count: Int, on relay: TokenRelayProcess) -> [AsyncCall<TestHTTPResponse>] {
        let port = relay.proxyPort
        let calls = (0..<count).map { _ in HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: port, method: "GET", path: "/busy") } }
        XCTAssertTrue(waitUntil(timeout: 5) { self.api.requestCount == count })
        return calls
    }

    /// Two busy connections on the main listener take the whole limit: a request on the route's listener
    /// gets the 503 that closes (it would have had slots of its own before), and is served once they end.
    func testBusyConnectionsOnTheMainListenerLeaveNoSlotOnARouteListener() throws {
        let (relay, payPort) = try startWithRouteListener(limit: 2)
        let gate = busyGate()
        let busy = busyRequests(2, on: relay)
        let refused = try HTTPTestConnection(port: payPort)
        let answer = try refused.send(method: "GET", path: "/over")
        XCTAssertEqual(answer.status, 503)
        XCTAssertEqual(answer.json()?["error"] as? String, "overloaded")
        XCTAssertEqual(answer.header("Connection"), "close")
        XCTAssertTrue(waitUntil(timeout: 5) { refused.peerClosed })
        XCTAssertEqual(payAPI.requestCount, 0, "the refused request never reached the route's upstream")
        gate.signal()
        gate.signal()
        for call in busy { XCTAssertEqual(try call.wait(timeout: 10).status, 200) }
        XCTAssertEqual(try HTTPTestClient.send(port: payPort, method: "GET", path: "/after").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { self.openConnections(relay) == 0 }, "count back to zero")
    }

    /// Two idle keep-alive connections on the main listener: a newcomer on the route's listener waits over
    /// the limit, the one idle the longest is closed for it after the grace, and it is served.
    func testAnIdleConnectionOnTheMainListenerMakesRoomOnARouteListener() throws {
        let (relay, payPort) = try startWithRouteListener(limit: 2)
        let first = try HTTPTestConnection(port: relay.proxyPort)
        let second = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertEqual(try first.send(method: "GET", path: "/one").status, 200)
        XCTAssertEqual(try second.send(method: "GET", path: "/two").status, 200)
        let newcomer = try HTTPTestConnection(port: payPort)
        XCTAssertTrue(waitUntil(timeout: 5) { first.peerClosed }, "the connection idle the longest, on the other listener, was closed")
        XCTAssertEqual(try newcomer.send(method: "GET", path: "/pay").status, 200)
        XCTAssertEqual(payAPI.requests.map(\.target), ["/pay"])
        XCTAssertFalse(second.peerClosed)
        second.close()
        newcomer.close()
        XCTAssertTrue(waitUntil(timeout: 5) { self.openConnections(relay) == 0 }, "count back to zero")
    }

    /// Limit 1, taken by a busy request on the main listener: a connection on the route's listener waits
    /// over the limit, so the busy one's answer closes its connection (a slot is wanted back), and the
    /// waiting one is let in when it does.
    func testAConnectionWaitingOnARouteListenerTakesTheSlotTheMainListenerFrees() throws {
        let (relay, payPort) = try startWithRouteListener(limit: 1)
        let gate = busyGate()
        let busy = busyRequests(1, on: relay)[0]
        let waiting = try HTTPTestConnection(port: payPort)
        XCTAssertTrue(waitUntil(timeout: 5) { self.openConnections(relay) == 2 })
        gate.signal()
        let answer = try busy.wait(timeout: 10)
        XCTAssertEqual(answer.status, 200)
        XCTAssertEqual(answer.header("Connection"), "close", "a connection waits on the other listener: the slot is wanted back")
        XCTAssertEqual(try waiting.send(method: "GET", path: "/promoted").status, 200)
        waiting.close()
        XCTAssertTrue(waitUntil(timeout: 5) { self.openConnections(relay) == 0 })
    }
}
