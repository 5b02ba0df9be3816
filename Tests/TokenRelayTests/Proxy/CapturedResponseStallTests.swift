import Foundation
import XCTest

/// A 401 is read to its end before the refresh rules decide (hold and replay, or pass it on). Found by the
/// black-box probe: while it was being read no deadline applied, so an upstream that sent a 401 head and
/// then went silent mid-body kept the client waiting, and the upstream connection taken, for as long as
/// the upstream cared to (a 200 in the same state is cut after `timeouts.stream_idle_seconds`).
final class CapturedResponseStallTests: RelayTestCase {
    func testA401WhoseBodyStallsIsAnsweredWithinTheStreamIdleLimit() throws {
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                if request.path == "/stall" {
                    try connection.write("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: 100\r\n\r\n0123456789")
                    _ = connection.waitForPeerClose(timeout: 30)
                    return
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL], "timeouts": ["stream_idle_seconds": 1]])
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/stall", timeout: 8)
        XCTAssertEqual(response.status, 504, response.bodyText)
        XCTAssertEqual(try get(relay, "/after").bodyText, "ok")
    }
}
