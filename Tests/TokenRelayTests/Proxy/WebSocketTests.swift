import Foundation
import XCTest

/// WebSocket upgrades through the transport engine: the handshake is an ordinary request (token
/// injected, a 401 refreshed and replayed), and after the upstream's 101 the two connections are relayed
/// byte for byte, with backpressure, until either side closes.
final class WebSocketTests: RelayTestCase {
    private var upstream: WebSocketEchoUpstream!

    override func tearDownWithError() throws {
        upstream?.stop()
        try super.tearDownWithError()
    }

    private func startWebSocketRelay(_ overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        let tokens = tokenServer!
        upstream = try WebSocketEchoUpstream { token in tokens.isAccessTokenValid(token) }
        return try startRelay(overrides.merging(["upstream": ["url": upstream.baseURL], "data_plane": "transport"]) { $1 },
                              subdirectory: "relay")
    }

    private func activeRequests(_ relay: TokenRelayProcess) -> Int? {
        (try? admin(relay, "/status"))?.json()?["active_requests"] as? Int
    }

    private func assertOpened(_ handshake: (status: Int, fields: [(String, String)]), file: StaticString = #filePath, line: UInt = #line) {
        func field(_ name: String) -> String? { handshake.fields.first { $0.0.lowercased() == name }?.1 }
        XCTAssertEqual(handshake.status, 101, file: file, line: line)
        XCTAssertEqual(field("upgrade")?.lowercased(), "websocket", file: file, line: line)
        XCTAssertEqual(field("connection")?.lowercased(), "upgrade", file: file, line: line)
        XCTAssertEqual(field("sec-websocket-accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", "RFC 6455's example key and answer", file: file, line: line)
    }

    private func exchangeMessages(_ client: WebSocketTestClient, file: StaticString = #filePath, line: UInt = #line) throws {
        try client.sendText("hello")
        let echoed = try client.readFrame()
        XCTAssertEqual(echoed.opcode, WebSocketFrame.text, file: file, line: line)
        XCTAssertEqual(String(decoding: echoed.payload, as: UTF8.self), "hello", file: file, line: line)
        let binary = (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        try client.send(WebSocketFrame.binary, binary)
        let back = try client.readFrame()
        XCTAssertEqual(back.opcode, WebSocketFrame.binary, file: file, line: line)
        XCTAssertEqual(back.payload, binary, file: file, line: line)
        try client.send(WebSocketFrame.ping, Array("are you there".utf8))
        XCTAssertEqual(try client.readFrame().opcode, WebSocketFrame.pong, file: file, line: line)
    }

    func testHandshakeWithTheTokenThenMessagesBothWays() throws {
        let relay = try startWebSocketRelay()
        let client = try WebSocketTestClient(port: relay.proxyPort)
        assertOpened(try client.handshake())
        try exchangeMessages(client)
        let seen = try XCTUnwrap(upstream.handshakes.first)
        func field(_ name: String) -> String? { seen.first { $0.0.lowercased() == name }?.1 }
        XCTAssertEqual(field("authorization"), "Bearer \(tokenServer.currentAccessToken ?? "")", "the token is injected")
        XCTAssertEqual(field("sec-websocket-key"), WebSocketTestClient.key)
        XCTAssertEqual(field("origin"), "http://legacy.example")
        XCTAssertEqual(activeRequests(relay), 1, "an open WebSocket counts as in flight")
        XCTAssertEqual(try admin(relay, "/status").json()?["client_connections"] as? Int, 1, "and its client connection counts")
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }

    /// The token expired: the handshake gets a 401, the relay refreshes once and replays the handshake,
    /// and the WebSocket then works both ways. The refresh token is presented once.
    func testHandshakeAfterExpiryIsReplayedAfterOneRefresh() throws {
        let relay = try startWebSocketRelay()
        tokenServer.expireAccessTokens()
        let client = try WebSocketTestClient(port: relay.proxyPort)
        assertOpened(try client.handshake())
        try exchangeMessages(client)
        XCTAssertEqual(upstream.unauthorized, 1)
        XCTAssertEqual(upstream.handshakes.count, 1)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// A 50 MiB message to a client that reads slowly: the relay holds the upstream back instead of
    /// buffering the difference, so its memory stays flat.
    func testLargeMessageToASlowReaderKeepsMemoryFlat() throws {
        let total = 50 * 1024 * 1024
        let relay = try startWebSocketRelay()
        XCTAssertEqual(try get(relay, "/warm").status, 400, "the upstream only speaks WebSocket")
        let idle = try XCTUnwrap(residentKiB(pid: relay.pid))
        let client = try WebSocketTestClient(port: relay.proxyPort, timeout: 30, receiveBuffer: 64 * 1024)
        assertOpened(try client.handshake())
        try client.sendText("big \(total)")
        let head = try WebSocketFrame.readHead(client.reader)
        XCTAssertEqual(head.opcode, WebSocketFrame.binary)
        XCTAssertEqual(head.length, total)
        var received = client.reader.takeBuffered(upTo: total)
        var peak = idle, reads = 0
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while received < total {
            let n = scratch.withUnsafeMutableBytes { recv(client.socket.fd, $0.baseAddress, min($0.count, total - received), 0) }
            guard n > 0 else { break }
            received += n
            reads += 1
            usleep(1000)   // the slow reader (pacing, not synchronisation)
            if reads % 32 == 0, let rss = residentKiB(pid: relay.pid) { peak = max(peak, rss) }
        }
        XCTAssertEqual(received, total)
        print("slow WebSocket reader: idle RSS \(idle) KiB, peak \(peak) KiB during a 50 MiB message")
        XCTAssertLessThan(peak - idle, 8 * 1024, "RSS grew from \(idle) KiB to \(peak) KiB")
        try client.sendText("still there")
        XCTAssertEqual(String(decoding: try client.readFrame().payload, as: UTF8.self), "still there")
    }

    /// The client closes: the upstream answers the close frame and closes, the client sees the end, and
    /// the relay lets go of both connections.
    func testCloseFromTheClientEndsBothSides() throws {
        let relay = try startWebSocketRelay()
        let client = try WebSocketTestClient(port: relay.proxyPort)
        assertOpened(try client.handshake())
        try client.sendText("hi")
        _ = try client.readFrame()
        try client.send(WebSocketFrame.close, [0x03, 0xE8])
        XCTAssertEqual(try client.readFrame().opcode, WebSocketFrame.close)
        XCTAssertTrue(client.readsEOF(), "the upstream's close reaches the client")
        client.socket.close()
        XCTAssertTrue(waitUntil(timeout: 10) { self.activeRequests(relay) == 0 && self.upstream.openConnections == 0 })
        XCTAssertEqual(upstream.closes, ["client"])
        XCTAssertEqual(try admin(relay, "/status").json()?["client_connections"] as? Int ?? 0, 0)
    }

    /// The upstream closes: its close frame and FIN reach the client, whose answer ends the tunnel.
    func testCloseFromTheUpstreamEndsBothSides() throws {
        let relay = try startWebSocketRelay()
        let client = try WebSocketTestClient(port: relay.proxyPort)
        assertOpened(try client.handshake())
        try client.sendText("close-me")
        let close = try client.readFrame()
        XCTAssertEqual(close.opcode, WebSocketFrame.close)
        XCTAssertEqual(close.payload, [0x03, 0xE8])
        try client.send(WebSocketFrame.close, [0x03, 0xE8])
        XCTAssertTrue(client.readsEOF())
        client.socket.close()
        XCTAssertTrue(waitUntil(timeout: 10) { self.activeRequests(relay) == 0 && self.upstream.openConnections == 0 })
        XCTAssertEqual(upstream.closes, ["server"])
    }

    /// Shutdown waits for an open WebSocket until the drain deadline, then cuts it (both sides closed)
    /// and exits cleanly; until then the WebSocket keeps working.
    func testShutdownCutsAnOpenWebSocketAtTheDrainDeadline() throws {
        let relay = try startWebSocketRelay(["timeouts": ["drain_seconds": 1.0]])
        let client = try WebSocketTestClient(port: relay.proxyPort)
        assertOpened(try client.handshake())
        relay.signal(SIGTERM)
        try exchangeMessages(client)
        XCTAssertTrue(client.readsEOF(), "cut at the deadline")
        XCTAssertEqual(relay.waitForExit(timeout: 10), 0)
        XCTAssertTrue(waitUntil(timeout: 10) { self.upstream.openConnections == 0 })
    }
}
