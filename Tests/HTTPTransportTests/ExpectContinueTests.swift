import Foundation
import Glibc
import HTTPTransport
import XCTest

/// An upstream on a thread that accepts one connection, reads the request head, and then runs `script`
/// with the socket (5 s receive timeout) and the head's text.
final class ScriptedUpstream: @unchecked Sendable {
    let port: UInt16
    private let fd: Int32
    /// Signalled once when the script has run and the socket is closed (for the test to wait on).
    let finished = DispatchSemaphore(value: 0)
    private let exited = DispatchSemaphore(value: 0)

    init(_ script: @escaping @Sendable (Int32, String) -> Void) {
        let (fd, port) = try! LoopbackListener.open()
        self.fd = fd
        self.port = port
        let listener = fd
        let done = finished
        let exit = exited
        Thread {
            defer { exit.signal() }
            let client = accept(listener, nil, nil)
            guard client >= 0 else { done.signal(); return }
            var tv = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            let seen = LoopbackListener.readHead(client)
            script(client, String(decoding: seen, as: UTF8.self))
            close(client)
            done.signal()
        }.start()
    }

    func stop() {
        _ = exited.wait(timeout: .now() + 10)
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }

    /// Reads exactly `count` bytes (fewer if the peer closes or 5 s pass).
    static func read(_ fd: Int32, count: Int) -> [UInt8] {
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while out.count < count {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, min($0.count, count - out.count)) }
            if n <= 0 { break }
            out.append(contentsOf: buffer[0..<n])
        }
        return out
    }

    /// Whether any byte arrives within `seconds`.
    static func anyBytes(_ fd: Int32, within seconds: Double) -> Bool {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&poller, 1, Int32(seconds * 1000)) > 0
    }

    static func write(_ fd: Int32, _ text: String) {
        _ = Array(text.utf8).withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
    }
}

/// Requests sent with `Expect: 100-continue`: the body waits for the upstream's 100, or for the wait's
/// end, and is never sent when a final answer comes first.
final class ExpectContinueTests: LoopThreadTestCase {
    /// Starts a request with a held body on a new connection to `port`.
    private func send(port: UInt16, body: BodyLength, bytes: [UInt8], wait: Double, recorder: RecordingClient) -> HTTPClientConnection? {
        let loop = loopThread.loop
        return loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: port)
            connection?.handler = recorder
            connection?.startRequest(method: "PUT", target: Array("/upload".utf8), fields: [("Host", "u"), ("Expect", "something-else")],
                                     body: body, continueWait: wait)
            XCTAssertEqual(connection?.canSendMore, false, "told to hold the body")
            connection?.sendBody(bytes)   // what the caller had in hand: held, not sent
            connection?.finishRequest()
            return connection
        }
    }

    func testBodyWaitsForContinue() throws {
        let seen = ResultBox<(head: String, early: Bool, body: [UInt8])>()
        let upstream = ScriptedUpstream { fd, head in
            let early = ScriptedUpstream.anyBytes(fd, within: 0.3)
            ScriptedUpstream.write(fd, "HTTP/1.1 100 Continue\r\n\r\n")
            let body = ScriptedUpstream.read(fd, count: 5)
            seen.value = (head, early, body)
            ScriptedUpstream.write(fd, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
            _ = ScriptedUpstream.anyBytes(fd, within: 5)   // until the client closes
        }
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let connection = send(port: upstream.port, body: .known(5), bytes: Array("hello".utf8), wait: 10, recorder: recorder)
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(Array(recorder.events.prefix(3)), ["informational 100", "head 201", "end"])
        XCTAssertTrue(seen.value!.head.contains("Expect: 100-continue\r\n"))
        XCTAssertFalse(seen.value!.head.contains("something-else"), "the caller's Expect is replaced")
        XCTAssertFalse(seen.value!.early, "no body byte before 100 Continue")
        XCTAssertEqual(seen.value!.body, Array("hello".utf8))
        XCTAssertEqual(loopThread.sync { connection?.continueState }, .received)
        XCTAssertEqual(loopThread.sync { connection?.bodyBytesSentBeforeResponse }, 5)
        XCTAssertEqual(recorder.reusableAtEnd, [true])
        loopThread.sync { connection?.close() }
    }

    func testBodyGoesAfterTheWaitWhenTheUpstreamSaysNothing() throws {
        let body = ResultBox<[UInt8]>()
        let upstream = ScriptedUpstream { fd, _ in
            body.value = ScriptedUpstream.read(fd, count: 13)   // chunked: "3\r\nabc\r\n0\r\n\r\n"
            ScriptedUpstream.write(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            _ = ScriptedUpstream.anyBytes(fd, within: 5)
        }
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let started = Date()
        let connection = send(port: upstream.port, body: .unknown, bytes: Array("abc".utf8), wait: 0.2, recorder: recorder)
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.15)
        XCTAssertEqual(String(decoding: body.value!, as: UTF8.self), "3\r\nabc\r\n0\r\n\r\n")
        XCTAssertEqual(loopThread.sync { connection?.continueState }, .waitExpired)
        XCTAssertEqual(recorder.reusableAtEnd, [true])
        loopThread.sync { connection?.close() }
    }

    /// A 401 before the body was asked for: the body never leaves (so it can be sent again after a
    /// refresh) and the connection is not reused (the upstream may still be waiting for the body).
    func testFinalResponseFirstMeansTheBodyIsNeverSent() throws {
        let late = ResultBox<Bool>()
        let upstream = ScriptedUpstream { fd, _ in
            ScriptedUpstream.write(fd, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            late.value = ScriptedUpstream.read(fd, count: 1).count > 0   // a body byte, or the close
        }
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let connection = send(port: upstream.port, body: .known(5), bytes: Array("hello".utf8), wait: 10, recorder: recorder)
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(loopThread.sync { connection?.continueState }, .finalResponseFirst)
        XCTAssertEqual(loopThread.sync { connection?.bodyBytesSentBeforeResponse }, 0)
        XCTAssertEqual(loopThread.sync { connection?.requestBodyBytesSent }, 0)
        XCTAssertEqual(recorder.reusableAtEnd, [false])
        XCTAssertEqual(upstream.finished.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(late.value, false, "the upstream saw the close, not the body")
    }

    /// The usual case, for contrast: the body has gone when the answer comes.
    func testBodySentWithoutTheExpectationCountsAsSent() throws {
        let upstream = ScriptedUpstream { fd, _ in
            _ = ScriptedUpstream.read(fd, count: 5)
            ScriptedUpstream.write(fd, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            _ = ScriptedUpstream.anyBytes(fd, within: 5)
        }
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: upstream.port)
            connection?.handler = recorder
            connection?.startRequest(method: "PUT", target: Array("/a".utf8), fields: [("Host", "u")], body: .known(5))
            connection?.sendBody(Array("hello".utf8))
            connection?.finishRequest()
            return connection
        }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(loopThread.sync { connection?.continueState }, .notExpected)
        XCTAssertEqual(loopThread.sync { connection?.bodyBytesSentBeforeResponse }, 5)
        loopThread.sync { connection?.close() }
    }

    /// More body than announced never reaches the upstream (it would read it as the next request).
    func testBodyIsCutAtItsAnnouncedLength() throws {
        let extra = ResultBox<Bool>()
        let upstream = ScriptedUpstream { fd, _ in
            _ = ScriptedUpstream.read(fd, count: 3)
            ScriptedUpstream.write(fd, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            extra.value = ScriptedUpstream.read(fd, count: 1).count > 0
        }
        defer { upstream.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: upstream.port)
            connection?.handler = recorder
            connection?.startRequest(method: "PUT", target: Array("/a".utf8), fields: [("Host", "u")], body: .known(3))
            connection?.sendBody(Array("abcGET /smuggled HTTP/1.1\r\nHost: u\r\n\r\n".utf8))
            connection?.finishRequest()
            return connection
        }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        XCTAssertEqual(recorder.reusableAtEnd, [false])
        XCTAssertEqual(upstream.finished.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(extra.value, false)
        withExtendedLifetime(connection) {}
    }
}
