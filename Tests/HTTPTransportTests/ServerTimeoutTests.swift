import Foundation
import HTTPTransport
import XCTest

/// The server's idle keep-alive timeout, request-body stall timeout and response send-stall timeout
/// (all `timeouts.client_seconds` in the product).
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

    /// A client that stops reading a response is disconnected once the socket has taken nothing for the
    /// send timeout, instead of holding its connection and the queued bytes for ever.
    func testClientThatStopsReadingIsDisconnectedAfterTheSendTimeout() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(sendTimeout: 0.3))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /stream?1000000000 HTTP/1.1\r\nHost: h\r\n\r\n")
        // Never reads: the kernel's buffers fill, then the server's queue, then the limit runs out.
        XCTAssertEqual(server.lastEnd(within: 10), .failed(errno: ETIMEDOUT))
    }

    /// A slow reader that keeps taking bytes is never cut, however long the whole response takes: any
    /// progress restarts the limit (here the transfer takes about three times the limit).
    func testASlowReaderThatKeepsReadingGetsTheWholeResponse() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(sendTimeout: 1))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        let total = 8 * 1024 * 1024
        try client.send("GET /known?\(total) HTTP/1.1\r\nHost: h\r\n\r\n")
        var received: [UInt8] = []
        var bodyStart: Int?
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        let started = Date()
        for _ in 0..<10_000 {
            if let bodyStart, received.count - bodyStart >= total { break }
            let n = chunk.withUnsafeMutableBytes { read(client.fd, $0.baseAddress, $0.count) }
            XCTAssertGreaterThan(n, 0, "the connection ended before the whole response")
            guard n > 0 else { return }
            received.append(contentsOf: chunk[0..<n])
            if bodyStart == nil, let end = received.firstRange(of: Array("\r\n\r\n".utf8))?.upperBound { bodyStart = end }
            Thread.sleep(forTimeInterval: 0.02)   // the reader's own pace: 64 KiB per 20 ms
        }
        XCTAssertEqual(Array(received[(bodyStart ?? 0)...]), expectedPattern(total))
        XCTAssertGreaterThan(Date().timeIntervalSince(started), 1.5, "slower than the limit in all")
        XCTAssertNil(server.lastEnd(within: 0.1), "the connection is still open")
    }
}
