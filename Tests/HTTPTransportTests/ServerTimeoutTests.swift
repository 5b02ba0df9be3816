import Foundation
import HTTPTransport
import XCTest

/// The server's idle keep-alive timeout and request-body stall timeout (`timeouts.client_seconds`).
final class ServerTimeoutTests: XCTestCase {
    func testIdleKeepAliveConnectionIsClosedAfterTheIdleTimeout() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(idleTimeout: 0.3))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200)
        let idleFrom = Date()
        XCTAssertTrue(client.readEOF(), "closed without an answer")
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(idleFrom), 0.25)
        XCTAssertEqual(server.lastEnd(), .idleTimeout)
    }

    func testSilentConnectionIsClosedAfterTheIdleTimeout() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(idleTimeout: 0.2))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        XCTAssertTrue(client.readEOF())
        XCTAssertEqual(server.lastEnd(), .idleTimeout)
    }

    /// A busy connection is not idle: a response that takes longer than the idle timeout is still sent.
    func testRequestWaitingForItsAnswerIsNotIdle() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(idleTimeout: 0.2))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /hold HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertFalse(client.hasBytes(within: 0.5), "nothing sent, nothing closed while the handler works")
        server.answerHeld()
        XCTAssertEqual(try client.readResponse().status, 200)
    }

    func testStalledRequestBodyIsAnswered408() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(bodyTimeout: 0.3))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
        let started = Date()
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 408)
        XCTAssertTrue(response.head.contains("Connection: close"))
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.25)
        XCTAssertTrue(client.readEOF())
        XCTAssertEqual(server.lastEnd(), .timedOut)
    }

    /// Time while the handler has paused reading is the handler's, not the client's.
    func testPausedReadingDoesNotCountAsAStall() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(bodyTimeout: 0.2))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /paused HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
        XCTAssertFalse(client.hasBytes(within: 0.5), "paused longer than the body timeout: no 408")
        XCTAssertFalse(server.received.contains { $0.hasPrefix("body") }, "nothing delivered while paused")
        server.resumePaused()
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "POST /paused\nhello")
    }
}
