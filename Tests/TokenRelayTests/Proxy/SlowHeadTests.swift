import Foundation
import XCTest

/// Slowloris: clients that trickle their request head keep restarting evhttp's per-connection timeout.
/// A head must be complete within `timeouts.client_header_seconds` of its first byte, while a body that
/// trickles after a complete head, and a keep-alive connection that is merely quiet, are left alone.
final class SlowHeadTests: RelayTestCase {
    func testTricklingHeadsAreClosedAndOthersAreServed() throws {
        let relay = try startRelay(["timeouts": ["client_header_seconds": 1, "client_seconds": 30]])
        let slow = try (0..<8).map { _ in try HTTPTestConnection(port: relay.proxyPort) }
        for connection in slow { try connection.writeRaw("GET /slow HTTP/1.1\r\nHost: x\r\n") }
        let quiet = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertEqual(try quiet.send(method: "GET", path: "/keep-alive").status, 200)

        // One more header byte every 100 ms: evhttp's own timeout never fires.
        let deadline = Date(timeIntervalSinceNow: 6)
        var closed: [Bool] = slow.map { _ in false }
        while Date() < deadline && closed.contains(false) {
            for (index, connection) in slow.enumerated() where !closed[index] {
                // Closed silently (evhttp engine) or answered 408 before the close (transport engine): an
                // answer to a head that is not complete can only be its refusal.
                if connection.peerClosed || connection.hasBytes { closed[index] = true } else { try? connection.writeRaw("X") }
            }
            Thread.sleep(forTimeInterval: 0.1)  // the client's pacing, not synchronisation
        }
        XCTAssertEqual(closed, slow.map { _ in true }, "every trickling head was cut off")
        XCTAssertEqual(api.requests.filter { $0.path == "/slow" }.count, 0)
        XCTAssertFalse(quiet.peerClosed, "a quiet keep-alive connection is not a slow head")
        XCTAssertEqual(try quiet.send(method: "GET", path: "/still-open").status, 200)
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_client_connection_limit_total{action=\"closed_slow_head\"} 8"), metrics)
    }

    func testATricklingBodyAfterACompleteHeadIsNotCut() throws {
        let relay = try startRelay(["timeouts": ["client_header_seconds": 1, "client_seconds": 30]])
        let uploading = try HTTPTestConnection(port: relay.proxyPort)
        try uploading.writeRaw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
        for _ in 0..<20 {
            try uploading.writeRaw("b")
            Thread.sleep(forTimeInterval: 0.1)  // the client's pacing: 2 s for the body, twice the head limit
        }
        let response = try uploading.readResponse(requestMethod: "POST")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, String(repeating: "b", count: 20))
    }
}
