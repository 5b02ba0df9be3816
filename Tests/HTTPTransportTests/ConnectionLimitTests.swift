import Foundation
import HTTPTransport
import XCTest

/// The exact client connection limit of `HTTPServer` (the evhttp path's `limits.max_client_connections`
/// behaviour): idle connections make room, a request over the limit gets the configured 503 and the
/// connection closes, beyond the allowance new connections wait in the listen backlog, and the count
/// returns to zero.
final class ConnectionLimitTests: XCTestCase {
    private func settings(max: Int, allowance: Int? = nil, grace: Double = 30) -> HTTPServer.Settings {
        HTTPServer.Settings(maxConnections: max, overLimitAllowance: allowance, idleGrace: grace,
                            overLimitResponse: HTTPResponseHead(status: 503, reason: "Service Unavailable", fields: [("Retry-After", "1")]),
                            overLimitBody: Array("{\"error\":\"overloaded\"}".utf8))
    }

    /// Sends GET /hold on a new connection and waits until the server has its head.
    private func busy(_ server: TransportTestServer, count: Int) throws -> [LoopbackClient] {
        let before = server.received.filter { $0 == "head /hold" }.count
        let clients = try (0..<count).map { _ in try LoopbackClient(port: server.port) }
        for client in clients { try client.send("GET /hold HTTP/1.1\r\nHost: h\r\n\r\n") }
        XCTAssertTrue(eventually { server.received.filter { $0 == "head /hold" }.count == before + count })
        return clients
    }

    func testRequestOverTheLimitIsAnswered503AndCloses() throws {
        let server = try TransportTestServer(settings: settings(max: 2))
        defer { server.stop() }
        let held = try busy(server, count: 2)
        let over = try LoopbackClient(port: server.port)
        try over.send("GET /over HTTP/1.1\r\nHost: h\r\n\r\n")
        let answer = try over.readResponse()
        XCTAssertEqual(answer.status, 503)
        XCTAssertTrue(answer.head.contains("Connection: close"))
        XCTAssertTrue(answer.head.contains("Retry-After: 1"))
        XCTAssertEqual(String(decoding: answer.body, as: UTF8.self), "{\"error\":\"overloaded\"}")
        XCTAssertTrue(over.readEOF())
        shutdown(over.fd, Int32(SHUT_RDWR))
        XCTAssertFalse(server.received.contains("head /over"), "the handler never saw the refused request")
        XCTAssertEqual(server.limitEvents, [.acceptedOverLimit, .refused])
        XCTAssertTrue(eventually { server.openConnections == 2 }, "the refused connection is gone once closed")
        XCTAssertEqual(server.lastEnd(), .refusedOverLimit)

        server.answerHeld()
        for client in held { XCTAssertEqual(try client.readResponse().status, 200) }
        let idle = try LoopbackClient(port: server.port)
        try idle.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try idle.readResponse().status, 503, "the held ones are idle now, but not for the grace")
        shutdown(idle.fd, Int32(SHUT_RDWR))
        _ = held.map { shutdown($0.fd, Int32(SHUT_RDWR)) }
        XCTAssertTrue(eventually { server.openConnections == 0 }, "count back to zero: \(server.openConnections)")
        let after = try LoopbackClient(port: server.port)
        try after.send("GET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        XCTAssertEqual(try after.readResponse().status, 200, "within the limit again")
    }

    func testIdleConnectionIsClosedToMakeRoom() throws {
        let server = try TransportTestServer(settings: settings(max: 2, grace: 0.2))
        defer { server.stop() }
        let first = try LoopbackClient(port: server.port)
        try first.send("GET /echo?1 HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try first.readResponse().status, 200)
        let second = try LoopbackClient(port: server.port)
        try second.send("GET /echo?2 HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try second.readResponse().status, 200)

        // The newcomer waits over the limit (or takes the slot at once if the grace has already passed);
        // the connection idle the longest is closed for it.
        let third = try LoopbackClient(port: server.port)
        XCTAssertTrue(first.readEOF(), "the connection idle the longest was closed")
        try third.send("GET /echo?3 HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try third.readResponse().status, 200)
        try second.send("GET /echo?2 HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try second.readResponse().status, 200, "the other one kept its slot")
        XCTAssertEqual(server.limitEvents.filter { $0 == .closedIdle }.count, 1)
        XCTAssertFalse(server.limitEvents.contains(.refused))
    }

    /// A connection in the middle of a request body is not idle, whatever its quiet time.
    func testHalfReceivedRequestIsNotClosedForRoom() throws {
        let server = try TransportTestServer(settings: settings(max: 1, grace: 0.1))
        defer { server.stop() }
        let uploading = try LoopbackClient(port: server.port)
        try uploading.send("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        XCTAssertTrue(eventually { server.received.contains("body 5") })
        let newcomer = try LoopbackClient(port: server.port)
        try newcomer.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try newcomer.readResponse().status, 503)
        try uploading.send("6\r\n world\r\n0\r\n\r\n")
        XCTAssertEqual(String(decoding: try uploading.readResponse().body, as: UTF8.self), "POST /echo\nhello world")
    }

    func testWaitingConnectionIsPromotedWhenASlotFrees() throws {
        let server = try TransportTestServer(settings: settings(max: 1))
        defer { server.stop() }
        let held = try busy(server, count: 1)[0]
        let waiting = try LoopbackClient(port: server.port)
        XCTAssertTrue(eventually { server.limitEvents == [.acceptedOverLimit] })
        server.answerHeld()
        let answer = try held.readResponse()
        XCTAssertTrue(answer.head.contains("Connection: close"), "while someone waits, answers give the slot back")
        XCTAssertTrue(held.readEOF())
        shutdown(held.fd, Int32(SHUT_RDWR))   // the slot frees when the socket is closed, after lingering
        try waiting.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try waiting.readResponse().status, 200)
        XCTAssertFalse(server.limitEvents.contains(.refused))
    }

    /// Two listeners sharing one limit (`ConnectionLimitGroup`): a busy connection on the first takes the
    /// only slot, so a connection on the second waits over the limit (and the busy one's answer closes, to
    /// give the slot back); when it closes, the waiting one on the other listener is promoted.
    func testListenersSharingALimitCountTogether() throws {
        let server = try TransportTestServer(settings: settings(max: 1), sharedLimitListener: true)
        defer { server.stop() }
        let held = try busy(server, count: 1)[0]
        let waiting = try LoopbackClient(port: server.secondPort)
        XCTAssertTrue(eventually { server.limitEvents == [.acceptedOverLimit] }, "the second listener's connection is over the shared limit")
        XCTAssertEqual(server.sync { $0.server.waitingConnections }, 1, "seen by both listeners")
        server.answerHeld()
        let answer = try held.readResponse()
        XCTAssertTrue(answer.head.contains("Connection: close"), "a connection waits on the other listener")
        XCTAssertTrue(held.readEOF())
        shutdown(held.fd, Int32(SHUT_RDWR))
        try waiting.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try waiting.readResponse().status, 200, "promoted into the slot the first listener freed")
        XCTAssertFalse(server.limitEvents.contains(.refused))
        // And a request on the first listener now waits behind the second's connection: 503, nothing idle.
        let over = try LoopbackClient(port: server.port)
        try over.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try over.readResponse().status, 503)
    }

    /// Beyond the limit plus the allowance the server stops accepting: the kernel keeps the newcomer in
    /// the backlog, and it is accepted (and answered) once connections close.
    func testBeyondTheAllowanceNewConnectionsWaitInTheBacklog() throws {
        let server = try TransportTestServer(settings: settings(max: 1, allowance: 2))
        defer { server.stop() }
        let held = try busy(server, count: 1)[0]
        let waiting = try (0..<2).map { _ in try LoopbackClient(port: server.port) }
        XCTAssertTrue(eventually { server.limitEvents.contains(.pausedAccepting) })
        XCTAssertEqual(server.openConnections, 3)

        let queued = try LoopbackClient(port: server.port)   // the kernel completes the handshake
        try queued.send("GET /queued HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertFalse(queued.hasBytes(within: 0.3), "answered while at the hard bound")
        XCTAssertEqual(server.openConnections, 3, "not accepted at the hard bound")

        waiting.forEach { close($0.fd) }
        let answer = try queued.readResponse()
        XCTAssertEqual(answer.status, 503, "accepted from the backlog; the one slot is still busy")
        server.answerHeld()
        XCTAssertEqual(try held.readResponse().status, 200)
    }

    func testRaisingTheLimitAtRuntimeLetsWaitingConnectionsIn() throws {
        let server = try TransportTestServer(settings: settings(max: 1))
        defer { server.stop() }
        let held = try busy(server, count: 1)[0]
        let waiting = try LoopbackClient(port: server.port)
        XCTAssertTrue(eventually { server.limitEvents == [.acceptedOverLimit] })
        server.sync { $0.server.settings.maxConnections = 2 }
        try waiting.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try waiting.readResponse().status, 200, "promoted by the reload, not refused")
        XCTAssertEqual(server.sync { $0.server.waitingConnections }, 0)
        server.answerHeld()
        XCTAssertEqual(try held.readResponse().status, 200)
    }

    /// Many short connections, some dropped mid-request: the count returns to zero (a leak would
    /// eventually stop the server from accepting anyone).
    func testCountDoesNotDriftUnderChurn() throws {
        let server = try TransportTestServer(settings: settings(max: 4, grace: 0.05))
        defer { server.stop() }
        let port = server.port
        let group = DispatchGroup()
        let statuses = ResultBox<[Int]>()
        statuses.value = []
        let lock = NSLock()
        for index in 0..<40 {
            group.enter()
            DispatchQueue.global().async {
                defer { group.leave() }
                guard let client = try? LoopbackClient(port: port) else { return }
                if index % 5 == 0 {
                    try? client.send("POST /dropped HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n")
                    return
                }
                try? client.send("GET /echo?\(index) HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
                let status = (try? client.readResponse().status) ?? 0
                lock.withLock { statuses.value!.append(status) }
            }
        }
        XCTAssertEqual(group.wait(timeout: .now() + 30), .success)
        for status in lock.withLock({ statuses.value! }) { XCTAssertTrue([200, 503].contains(status), "status \(status)") }
        XCTAssertTrue(eventually(10) { server.openConnections == 0 }, "left: \(server.openConnections)")
        XCTAssertEqual(server.sync { $0.server.waitingConnections }, 0)
    }
}
