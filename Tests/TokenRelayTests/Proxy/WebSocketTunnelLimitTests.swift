import Foundation
import XCTest

/// A tunnel's upstream connection used to stay counted against `limits.max_upstream_connections` until
/// it closed: with as many WebSockets open as the pool allows, every plain request waited
/// `pool_wait_seconds` and got 503. Tunnels leave the pool at their 101 and are bounded by
/// `limits.max_tunnels` instead.
final class WebSocketTunnelLimitTests: RelayTestCase {
    func testOpenTunnelsNeverTakeTheConnectionsOrdinaryRequestsNeed() throws {
        let tokens = tokenServer!
        let upstream = try WebSocketEchoUpstream { token in tokens.isAccessTokenValid(token) }
        defer { upstream.stop() }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL],
                                    "limits": ["max_upstream_connections": 4, "max_tunnels": 130],
                                    "timeouts": ["pool_wait_seconds": 3]])
        var tunnels: [WebSocketTestClient] = []
        defer { for tunnel in tunnels { tunnel.socket.close() } }
        for index in 0..<130 {
            let client = try WebSocketTestClient(port: relay.proxyPort)
            XCTAssertEqual(try client.handshake().status, 101, "tunnel \(index)")
            tunnels.append(client)
        }
        try tunnels[0].sendText("still there")
        XCTAssertEqual(String(decoding: try tunnels[0].readFrame().payload, as: UTF8.self), "still there")

        // The echo upstream answers a plain GET 400: an answer from the upstream, not the relay's 503.
        let started = Date()
        let plain = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/plain", timeout: 5)
        XCTAssertEqual(plain.status, 400, "a plain request beside 130 tunnels reaches the upstream: \(plain.bodyText)")
        XCTAssertLessThan(Date().timeIntervalSince(started), 2, "without waiting for pool_wait_seconds")

        // One more tunnel is over limits.max_tunnels: 503 before it goes upstream.
        let handshakesBefore = upstream.handshakes.count
        let extra = try WebSocketTestClient(port: relay.proxyPort)
        defer { extra.socket.close() }
        XCTAssertEqual(try extra.handshake().status, 503)
        XCTAssertEqual(upstream.handshakes.count, handshakesBefore, "the refused handshake never went upstream")

        // A closed tunnel gives its slot back.
        tunnels.removeLast().socket.close()
        var reopened: Int?
        XCTAssertTrue(waitUntil(timeout: 10, interval: 0.05) {
            guard let client = try? WebSocketTestClient(port: relay.proxyPort), let status = try? client.handshake().status else { return false }
            if status == 101 { tunnels.append(client) } else { client.socket.close() }
            reopened = status
            return status == 101
        }, "a tunnel opens again once one has closed (last: \(String(describing: reopened)))")
    }
}
