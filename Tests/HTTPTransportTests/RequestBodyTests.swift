import Foundation
import HTTPTransport
import XCTest

/// Request bodies on the server side: 100-continue is the handler's decision, backpressure through
/// `pauseReading`, no size limit unless a hard cap is configured, and framing errors answered at once
/// (issue 14 items 11 and 12).
final class RequestBodyTests: XCTestCase {
    func testContinueIsNeverSentByTheTransportItself() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        XCTAssertTrue(eventually { server.received.contains("head /echo") })
        XCTAssertFalse(client.hasBytes(within: 0.2), "no automatic 100 Continue")
        try client.send("hello")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "POST /echo\nhello")
    }

    func testHandlerSendsContinueOnce() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /continue HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        let interim = try client.readResponse()
        XCTAssertEqual(interim.status, 100)
        XCTAssertEqual(interim.head, "HTTP/1.1 100 Continue\r\n\r\n")
        try client.send("hello")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200, "one 100 Continue, then the final answer")
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "POST /continue\nhello")
        // Without the expectation the handler's call writes nothing.
        try client.send("POST /continue HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nok")
        XCTAssertEqual(try client.readResponse().status, 200)
    }

    /// A final answer before the body: the body was never read, so the connection closes after it.
    func testFinalAnswerInsteadOfContinueClosesTheConnection() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("PUT /early HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 401)
        XCTAssertTrue(response.head.contains("Connection: close"))
        XCTAssertTrue(client.readEOF())
    }

    /// A paused request body is not read: the client's writes block on TCP flow control, and everything
    /// arrives once reading resumes.
    func testPausedReadingHoldsTheUploadBack() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port, timeoutSeconds: 20)
        let total = 16 << 20
        let finished = ResultBox<Bool>()
        let sent = DispatchSemaphore(value: 0)
        Thread {
            var bytes = Array("POST /paused HTTP/1.1\r\nHost: h\r\nContent-Length: \(total)\r\n\r\n".utf8)
            bytes.append(contentsOf: [UInt8](repeating: 0x62, count: total))
            finished.value = (try? client.send(bytes)) != nil
            sent.signal()
        }.start()
        XCTAssertTrue(eventually { server.received.contains("head /paused") })
        XCTAssertEqual(sent.wait(timeout: .now() + 0.5), .timedOut, "the upload is held back")
        XCTAssertFalse(server.received.contains { $0.hasPrefix("body") })
        server.resumePaused()
        XCTAssertEqual(sent.wait(timeout: .now() + 20), .success)
        XCTAssertEqual(finished.value, true)
        let response = try client.readResponse()
        XCTAssertEqual(response.body.count, "POST /paused\n".utf8.count + total)
    }

    /// Without a hard cap, a body of any size is delivered (the product streams large uploads).
    func testNoBodyLimitWithoutAHardCap() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        let total = 9 << 20
        let writer = Thread {
            var bytes = Array("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: \(total)\r\n\r\n".utf8)
            bytes.append(contentsOf: [UInt8](repeating: 0x61, count: total))
            try? client.send(bytes)
        }
        writer.start()
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.body.count, "POST /echo\n".utf8.count + total)
    }

    /// With a hard cap, a longer Content-Length is answered 413 at once, before the body, even when the
    /// client waits for 100 Continue; the handler never sees the request.
    func testHardCapRefusesALongerLengthAtOnce() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(maxBodyBytes: 10))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 413)
        XCTAssertTrue(response.head.contains("Connection: close"))
        XCTAssertTrue(client.readEOF())
        XCTAssertEqual(server.lastEnd(), .bodyTooLarge)
        XCTAssertFalse(server.received.contains("head /echo"))

        let within = try LoopbackClient(port: server.port)
        try within.send("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123456789")
        XCTAssertEqual(try within.readResponse().status, 200)
    }

    func testHardCapRefusesAChunkedBodyThatGrowsPastIt() throws {
        let server = try TransportTestServer(settings: HTTPServer.Settings(maxBodyBytes: 10))
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n")
        XCTAssertTrue(eventually { server.received.contains("body 8") })
        try client.send("3\r\nabc\r\n0\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 413)
        XCTAssertEqual(server.lastEnd(), .bodyTooLarge)
    }

    /// Issue 14 item 12: an unparsable or overflowing length is answered 400 at once, also when the
    /// client waits for 100 Continue (no wait for a timeout).
    func testOverflowingContentLengthIsAnswered400AtOnce() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        for length in ["99999999999999999999999", "1e3", "-1", "0x10"] {
            let client = try LoopbackClient(port: server.port)
            try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: \(length)\r\n\r\n")
            let started = Date()
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 400, length)
            XCTAssertLessThan(Date().timeIntervalSince(started), 2, "answered at once")
            XCTAssertTrue(client.readEOF())
        }
        XCTAssertFalse(server.received.contains("head /echo"))
    }

    /// Issue 14 item 11: chunk extensions are valid and dropped; malformed sizes are 400.
    func testChunkExtensionsAreAcceptedAndBadSizesRefused() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;foo=bar\r\nhello\r\n1 ; a=\"b c\"\r\n!\r\n0;last\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "POST /echo\nhello!")
        for size in ["0x5", " 5", "+5", "zz", "5 5", ""] {
            let bad = try LoopbackClient(port: server.port)
            try bad.send("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n\(size)\r\nhello\r\n0\r\n\r\n")
            XCTAssertEqual(try bad.readResponse().status, 400, "size \"\(size)\"")
        }
    }
}

/// Waits (bounded) until `condition` holds, polling.
func eventually(_ seconds: Double = 5, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while !condition() {
        if Date() > deadline { return false }
        usleep(2000)
    }
    return true
}
