import Foundation
import XCTest

/// An upstream connection that ends in a reset (RST, not FIN) must give its pool slot back like one that
/// ends in an orderly close. Found by the black-box probe: every reset leaked a slot for good, so with
/// `limits.max_upstream_connections` resets (128 by default: an upstream restarted under load, a
/// load balancer cutting connections) every later request waited out `pool_wait_seconds` and got 503.
final class UpstreamResetTests: RelayTestCase {
    /// `/reset` is answered with `answer` and then reset; anything else with a plain 200.
    private func startRelay(answeringResetWith answer: String) throws -> TokenRelayProcess {
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                if request.path == "/reset" {
                    if !answer.isEmpty { try connection.write(answer) }
                    connection.resetOnClose()
                    return
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        // One upstream connection, and a short wait for it: a leaked slot shows as a 503 at once.
        return try startRelay(["upstream": ["url": upstream.baseURL],
                               "limits": ["max_upstream_connections": 1],
                               "timeouts": ["pool_wait_seconds": 2]])
    }

    private func assertPoolStillServes(_ relay: TokenRelayProcess, file: StaticString = #filePath, line: UInt = #line) throws {
        for round in 0..<3 {
            let response = try get(relay, "/after")
            XCTAssertEqual(response.status, 200, "round \(round): \(response.bodyText)", file: file, line: line)
        }
    }

    func testAResetMidBodyFreesItsPoolSlot() throws {
        let relay = try startRelay(answeringResetWith: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
        for _ in 0..<2 {
            _ = try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data("GET /reset HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
            try assertPoolStillServes(relay)
        }
    }

    func testAResetBeforeAnyResponseFreesItsPoolSlot() throws {
        let relay = try startRelay(answeringResetWith: "")
        for _ in 0..<2 {
            let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/reset", timeout: 10)
            XCTAssertEqual(response.status, 502, response.bodyText)
            try assertPoolStillServes(relay)
        }
    }
}
