import Foundation
import Glibc
import HTTPTransport
import HTTPWire
import XCTest

/// Records what an upstream connection reports; the test thread waits on `signal`.
final class RecordingClient: HTTPClientConnectionHandler, @unchecked Sendable {
    private let lock = NSLock()
    let signal = DispatchSemaphore(value: 0)
    private var _events: [String] = []
    private var _body: [UInt8] = []
    var events: [String] { lock.withLock { _events } }
    var body: [UInt8] { lock.withLock { _body } }
    var reusableAtEnd: [Bool] { lock.withLock { _reusable } }
    private var _reusable: [Bool] = []

    private func note(_ event: String) {
        lock.withLock { _events.append(event) }
        signal.signal()
    }

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) { note("informational \(status)") }
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) { note("head \(head.status)") }
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        lock.withLock { _body.append(contentsOf: bytes) }
    }
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        lock.withLock { _reusable.append(connection.isReusable) }
        note("end")
    }
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        note("ended \(ended) started=\(responseStarted)")
    }

    /// Events named `name` ("end" does not count "ended ...").
    func count(_ name: String) -> Int { events.filter { $0 == name || $0.hasPrefix(name + " ") }.count }
}

/// An upstream that accepts one connection, reads one request head and answers with fixed bytes, then
/// keeps the connection open (so that a close is never what makes the proxy give up on it).
final class CannedUpstream: @unchecked Sendable {
    let port: UInt16
    private let fd: Int32
    private let done = DispatchSemaphore(value: 0)

    init(answer: String) {
        let (fd, port) = try! LoopbackListener.open()
        self.fd = fd
        self.port = port
        let listener = fd
        let finished = done
        let bytes = Array(answer.utf8)
        Thread {
            let client = accept(listener, nil, nil)
            var tv = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            _ = LoopbackListener.readHead(client)
            _ = bytes.withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
            _ = finished.wait(timeout: .now() + 10)
            close(client)
        }.start()
    }

    func stop() {
        done.signal()
        shutdown(fd, Int32(SHUT_RDWR))   // wakes a thread still blocked in accept
        close(fd)
    }
}

final class HTTPClientConnectionTests: LoopThreadTestCase {
    /// Connects on the loop thread and sends one request; returns the recorder and the connection.
    private func request(port: UInt16, method: String = "GET", target: String, body: BodyLength = .none, bodyBytes: [UInt8] = [],
                         on existing: HTTPClientConnection? = nil, recorder: RecordingClient = RecordingClient()) -> (RecordingClient, HTTPClientConnection?) {
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = existing ?? (try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: port))
            connection?.handler = recorder
            connection?.startRequest(method: method, target: Array(target.utf8), fields: [("Host", "upstream"), ("Authorization", "Bearer t")], body: body)
            if !bodyBytes.isEmpty { connection?.sendBody(bodyBytes) }
            connection?.finishRequest()
            return connection
        }
        return (recorder, connection)
    }

    func testKeepAliveRequestsReuseTheConnection() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let (recorder, connection) = request(port: server.port, target: "/echo?1")
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 })
        XCTAssertEqual(String(decoding: recorder.body, as: UTF8.self), "GET /echo?1\n")
        XCTAssertEqual(recorder.reusableAtEnd, [true])
        _ = request(port: server.port, method: "POST", target: "/echo?2", body: .known(3), bodyBytes: Array("abc".utf8), on: connection, recorder: recorder)
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 2 })
        XCTAssertEqual(String(decoding: recorder.body, as: UTF8.self), "GET /echo?1\nPOST /echo?2\nabc")
        _ = request(port: server.port, method: "PUT", target: "/echo?3", body: .unknown, bodyBytes: Array("chunked".utf8), on: connection, recorder: recorder)
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 3 })
        XCTAssertTrue(String(decoding: recorder.body, as: UTF8.self).hasSuffix("PUT /echo?3\nchunked"))
        XCTAssertEqual(recorder.count("ended"), 0)
        loopThread.sync { connection?.close() }
    }

    func testLargeChunkedResponseArrivesWhole() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let (recorder, connection) = request(port: server.port, target: "/stream?3000000")
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 10) { recorder.count("end") == 1 })
        XCTAssertTrue(recorder.body == expectedPattern(3_000_000))
        loopThread.sync { connection?.close() }
    }

    /// Issue 14 item 1: a second response in the same write as the first is never read as the answer to
    /// the next request: the connection is not reusable and is closed.
    func testBytesAfterACompleteResponseMakeTheConnectionUnusable() throws {
        let forged = "HTTP/1.1 200 OK\r\nSet-Cookie: session=attacker\r\nContent-Length: 4\r\n\r\nevil"
        for first in ["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n"] {
            let upstream = CannedUpstream(answer: first + forged)
            defer { upstream.stop() }
            let (recorder, connection) = request(port: upstream.port, target: "/a")
            XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("ended") == 1 }, "\(recorder.events)")
            XCTAssertEqual(recorder.reusableAtEnd, [false], first)
            XCTAssertFalse(loopThread.sync { connection?.isReusable ?? true })
            XCTAssertEqual(recorder.count("head"), 1)
            XCTAssertEqual(recorder.events.last, "ended unsolicitedBytes started=true")
        }
    }

    /// Issue 14 item 8: conflicting framing from the upstream is a protocol error, never relayed.
    func testConflictingResponseFramingEndsTheConnection() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\nhello")
        defer { upstream.stop() }
        let (recorder, connection) = request(port: upstream.port, target: "/a")
        defer { withExtendedLifetime(connection) {} }   // the caller owns its connections
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("ended") == 1 }, "\(recorder.events)")
        XCTAssertEqual(recorder.count("head"), 0)
        XCTAssertEqual(recorder.events.last, "ended protocolError(HTTPWire.HTTPWireError.conflictingContentLength) started=true")
    }

    func testInterimResponsesAreReportedBeforeTheFinalOne() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        defer { upstream.stop() }
        let (recorder, connection) = request(port: upstream.port, method: "POST", target: "/a", body: .known(1), bodyBytes: [0x78])
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 })
        XCTAssertEqual(Array(recorder.events.prefix(3)), ["informational 100", "head 201", "end"])
        XCTAssertEqual(recorder.reusableAtEnd, [true])
        loopThread.sync { connection?.close() }
    }

    /// Issue 14 item 11, response side: chunk extensions are valid and dropped, not an empty reply.
    func testChunkExtensionsInAResponseAreAccepted() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;foo=bar\r\nhello\r\n1 ; q=\"x y\"\r\n!\r\n0;end\r\n\r\n")
        defer { upstream.stop() }
        let (recorder, connection) = request(port: upstream.port, target: "/a")
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(String(decoding: recorder.body, as: UTF8.self), "hello!")
        XCTAssertEqual(recorder.reusableAtEnd, [true])
        loopThread.sync { connection?.close() }
    }

    func testRefusedConnectFailsBeforeAnyResponse() throws {
        // A port that was just free: bind, read it, close.
        let probe = CannedUpstream(answer: "")
        let port = probe.port
        probe.stop()
        let (recorder, connection) = request(port: port, target: "/a")
        defer { withExtendedLifetime(connection) {} }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("ended") == 1 })
        XCTAssertEqual(recorder.events.last, "ended connectFailed(\"connect 127.0.0.1:\(port): Connection refused\") started=false")
    }

    /// An answer that arrives before the request body was all sent (an early 401) leaves the connection
    /// unusable: the rest of the body would become the start of the next request.
    func testEarlyResponseBeforeTheBodyMakesTheConnectionUnusable() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: upstream.port)
            connection?.handler = recorder
            connection?.startRequest(method: "POST", target: Array("/a".utf8), fields: [("Host", "u")], body: .known(1000))
            connection?.sendBody([UInt8](repeating: 0x61, count: 10))
            return connection
        }
        defer { withExtendedLifetime(connection) {} }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(recorder.reusableAtEnd, [false])
    }

    func testIPv6LoopbackBothWays() throws {
        let server = try TransportTestServer(host: "::1")
        defer { server.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "[::1]", port: server.port)
            connection?.handler = recorder
            connection?.startRequest(method: "GET", target: Array("/peer".utf8), fields: [("Host", "u")], body: .none)
            connection?.finishRequest()
            return connection
        }
        defer { withExtendedLifetime(connection) {} }
        XCTAssertEqual(connection?.remote?.description, "[::1]:\(server.port)")
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertTrue(String(decoding: recorder.body, as: UTF8.self).hasPrefix("[::1]:"), String(decoding: recorder.body, as: UTF8.self))
        loopThread.sync { connection?.close() }
    }

    /// An upstream that accepts and never answers is given up on after the silence limit, reported as
    /// timed out before any response byte (so the caller knows the request may be retried or answered 504).
    func testSilentUpstreamTimesOut() throws {
        let upstream = CannedUpstream(answer: "")
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let started = Date()
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: upstream.port)
            connection?.handler = recorder
            connection?.setSilenceLimit(0.3)
            connection?.startRequest(method: "GET", target: Array("/slow".utf8), fields: [("Host", "u")], body: .none)
            connection?.finishRequest()
            return connection
        }
        defer { withExtendedLifetime(connection) {} }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("ended") == 1 }, "\(recorder.events)")
        XCTAssertEqual(recorder.events.last, "ended timedOut started=false")
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.25)
    }

    /// A response that keeps arriving is never cut by the silence limit, however long it takes in all.
    func testSilenceLimitCountsGapsNotTheWholeResponse() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: server.port)
            connection?.handler = recorder
            connection?.setSilenceLimit(5)
            connection?.startRequest(method: "GET", target: Array("/stream?2000000".utf8), fields: [("Host", "u")], body: .none)
            connection?.finishRequest()
            return connection
        }
        defer { withExtendedLifetime(connection) {} }
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 10) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(recorder.body.count, 2_000_000)
        XCTAssertEqual(recorder.count("ended"), 0)
        loopThread.sync { connection?.close() }
    }
}
