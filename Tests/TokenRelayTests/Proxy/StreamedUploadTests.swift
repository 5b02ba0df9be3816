import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Request bodies over `limits.max_body_bytes` on the transport engine: streamed to the upstream with
/// `Expect: 100-continue` instead of refused, replayable only while no body byte has left.
final class StreamedUploadTests: RelayTestCase {
    private static let mebibyte = 1024 * 1024
    /// 20 MiB that no shift or truncation leaves unchanged.
    private static let payload: Data = pattern(20 * mebibyte)

    private static func pattern(_ count: Int) -> Data {
        var data = Data(count: count)
        data.withUnsafeMutableBytes { (bytes: UnsafeMutableRawBufferPointer) in
            for i in 0..<count { bytes[i] = UInt8(truncatingIfNeeded: i &* 31 &+ (i >> 13)) }
        }
        return data
    }

    private func startTransportRelay(_ overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        var all = overrides
        all["data_plane"] = "transport"
        return try startRelay(all)
    }

    /// The fake API answers uploads briefly (no digest of 20 MiB per request); the test compares what it
    /// recorded.
    private func answerUploadsBriefly() {
        api.responseOverride = { request in
            request.path == "/upload" ? .json(200, ["received": request.body.count]) : nil
        }
    }

    private func upload(_ relay: TokenRelayProcess, _ body: Data = payload, headers: [(String, String)] = []) throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/upload",
                                headers: [("Content-Type", "application/octet-stream")] + headers, body: body, timeout: 60)
    }

    /// Requests that reached the API with their body (a head answered before its body has none).
    private var deliveredBodies: [Data] { api.requests.map(\.body).filter { !$0.isEmpty } }

    func testA20MiBUploadPassesByteIdentical() throws {
        let relay = try startTransportRelay()
        answerUploadsBriefly()
        let response = try upload(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(api.requestCount, 1)
        let received = try XCTUnwrap(api.requests.first)
        XCTAssertTrue(received.body == Self.payload, "the body arrived altered (\(received.body.count) bytes)")
        XCTAssertEqual(received.header("Expect"), "100-continue", "a streamed body waits for the upstream's 100")
        XCTAssertEqual(received.header("Content-Length"), "\(Self.payload.count)")
        XCTAssertEqual(api.continuesSent, 1)
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }

    /// The token died: the upstream refuses the head before the body leaves, so the request is refreshed
    /// for, sent again, and its body goes once.
    func testA401BeforeTheBodyIsRefreshedOnceAndTheBodyDeliveredOnce() throws {
        let relay = try startTransportRelay()
        answerUploadsBriefly()
        tokenServer.expireAccessTokens()
        let response = try upload(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(api.answeredBeforeBody, 1, "the first attempt was refused on its head")
        XCTAssertEqual(api.requestCount, 2)
        XCTAssertEqual(deliveredBodies.count, 1, "the body went upstream exactly once")
        XCTAssertTrue(deliveredBodies.first == Self.payload, "the body arrived altered")
    }

    /// A chunked body that grows past the limit is streamed from there, the part collected before it
    /// first; refused on its head, it is replayed whole.
    func testAChunkedBodyOverTheLimitIsStreamedWithItsCollectedStartFirst() throws {
        let relay = try startTransportRelay(["limits": ["max_body_bytes": Self.mebibyte]])
        answerUploadsBriefly()
        tokenServer.expireAccessTokens()
        let body = Self.pattern(3 * Self.mebibyte + 12345)
        var chunked = Data()
        var offset = 0
        while offset < body.count {
            let size = min(100_000, body.count - offset)
            chunked.append(Data((String(size, radix: 16) + "\r\n").utf8))
            chunked.append(body[offset..<offset + size])
            chunked.append(Data("\r\n".utf8))
            offset += size
        }
        chunked.append(Data("0\r\n\r\n".utf8))
        let response = try upload(relay, chunked, headers: [("Transfer-Encoding", "chunked")])
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(deliveredBodies.count, 1)
        XCTAssertTrue(deliveredBodies.first == body, "the body arrived altered (\(deliveredBodies.first?.count ?? 0) bytes)")
        XCTAssertEqual(api.requests.last?.wasChunked, true)
    }

    /// A client that asks `Expect: 100-continue` itself, with a dead token: its 100 comes after the
    /// refresh and the upstream's 100 to the replay, and the body it then sends goes upstream once.
    func testTheClientsOwnExpectWaitsForTheRefreshAndTheReplay() throws {
        let relay = try startTransportRelay(["limits": ["max_body_bytes": Self.mebibyte]])
        answerUploadsBriefly()
        tokenServer.expireAccessTokens()
        let body = Self.pattern(2 * Self.mebibyte)
        let client = try HTTPTestConnection(port: relay.proxyPort, timeout: 20)
        try client.writeRaw("POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: \(body.count)\r\n\r\n")
        XCTAssertTrue(waitUntil(timeout: 10) { client.hasBytes }, "no answer to the head")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1, "the 100 came after the refresh")
        XCTAssertEqual(api.answeredBeforeBody, 1)
        XCTAssertEqual(api.continuesSent, 1, "and after the upstream's 100 to the replay")
        try client.writeRaw(body)
        let response = try client.readResponse(requestMethod: "POST")   // skips the 100
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(deliveredBodies.count, 1)
        XCTAssertTrue(deliveredBodies.first == body, "the body arrived altered")
    }

    /// An upstream that never answers the expectation gets the body when `timeouts.continue_seconds` ends.
    func testAnUpstreamThatIgnoresExpectGetsTheBodyAfterTheWait() throws {
        let relay = try startTransportRelay(["timeouts": ["continue_seconds": 0.3]])
        answerUploadsBriefly()
        api.expectation = .ignore
        let started = Date()
        let response = try upload(relay)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.3, "the body waited for the 100 first")
        let received = try XCTUnwrap(api.requests.first)
        XCTAssertEqual(received.header("Expect"), "100-continue")
        XCTAssertTrue(received.body == Self.payload, "the body arrived altered")
        XCTAssertEqual(api.continuesSent, 0)
    }

    /// Once the body has gone, a 401 is the client's: nothing is sent again. The token is dead all the
    /// same, so it is refreshed (see `StreamedUploadRefreshTests`).
    func testA401AfterTheBodyLeftReachesTheClientUnreplayed() throws {
        let relay = try startTransportRelay()
        answerUploadsBriefly()
        api.forceUnauthorizedOnce(path: "/upload")
        let response = try upload(relay)
        XCTAssertEqual(response.status, 401)
        XCTAssertEqual(response.json()?["error"] as? String, "invalid_token", "the upstream's own 401")
        XCTAssertEqual(api.requestCount, 1, "not replayed")
        XCTAssertTrue(api.requests.first?.body == Self.payload)
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 1 }, "the refresh rules heard of the 401")
        let replays = try admin(relay, "/metrics").bodyText.split(separator: "\n").filter { $0.hasPrefix("tokenrelay_replays_total{") }
        XCTAssertTrue(replays.allSatisfy { $0.hasSuffix(" 0") || $0.hasSuffix(" 0.0") }, replays.joined(separator: "\n"))
    }

    /// Held for a refresh that does not end, a streamed upload is bounded by the hold timeout like any
    /// held request: its body was never read (it waited in the client's socket), and the client is
    /// answered 503 without having sent a byte of it.
    func testAHeldStreamedUploadIsBoundedByTheHoldTimeout() throws {
        let relay = try startTransportRelay(["timeouts": ["hold_seconds": 0.5]])
        tokenServer.failureMode = .gated
        defer { tokenServer.openGate() }
        tokenServer.expireAccessTokens()
        let client = try HTTPTestConnection(port: relay.proxyPort, timeout: 20)
        try client.writeRaw("POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(Self.payload.count)\r\n\r\n")
        let response = try client.readResponse(requestMethod: "POST")
        XCTAssertEqual(response.status, 503, response.bodyText)
        XCTAssertEqual(api.answeredBeforeBody, 1, "refused on its head")
        XCTAssertTrue(deliveredBodies.isEmpty)
        XCTAssertTrue(waitUntil(timeout: 5) { client.peerClosed }, "the unread body cannot be told from a next request: the connection closes")
    }

    /// A streamed upload whose client leaves while the request is held for a refresh is not replayed: its
    /// body waits unread in the client's socket, so the relay asks after the client before sending the
    /// head again (with a fresh token, for a body that will never come). Logged and counted as 499.
    func testAHeldStreamedUploadWhoseClientLeftIsNotReplayed() throws {
        // Every head is recorded; the first is refused before its body, as an expired token would be.
        let heads = Locked<[RecordedRequest]>([])
        let upstream = try RawUpstream { connection in
            guard let head = try connection.readHead() else { return }
            let first = heads.withLock { $0.append(head); return $0.count == 1 }
            if first {
                try connection.write("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            } else {
                _ = try? connection.readBody(Self.payload.count)
            }
        }
        defer { upstream.stop() }
        let relay = try startTransportRelay(["log": ["access": true], "upstream": ["url": upstream.baseURL],
                                             "timeouts": ["continue_seconds": 0.2]])
        tokenServer.failureMode = .gated
        defer { tokenServer.openGate() }
        let client = try HTTPTestConnection(port: relay.proxyPort, timeout: 20)
        try client.writeRaw("POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(Self.payload.count)\r\n\r\n")
        // What it sent of its body fits in the relay's socket buffer: its close is behind it (one that
        // leaves with more unsent than the buffers hold is noticed only when its body is read).
        try client.writeRaw(Self.payload.prefix(16 * 1024))
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 1 }, "held for a refresh")
        client.close()
        tokenServer.openGate()
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("msg=request ") }, relay.stderrText)
        let line = relay.stderrText.split(separator: "\n").first { $0.contains("msg=request ") } ?? ""
        XCTAssertTrue(line.contains("status=499"), String(line))
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(heads.withLock { $0.count }, 1, "the head was not sent again for a client that left")
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_requests_total{status=\"499\"} 1"), metrics)
        XCTAssertTrue(metrics.contains("tokenrelay_hold_duration_seconds_count{outcome=\"client_gone\"} 1"), metrics)
    }

    /// A client faster than the upstream is held back (the relay stops reading it), not buffered: over
    /// 48 MiB the relay's memory grows by far less than the body.
    func testAStreamedUploadToASlowUpstreamIsHeldBackNotBuffered() throws {
        let blocks = 48
        let block = Self.pattern(Self.mebibyte)
        let total = blocks * block.count
        let peakRSS = Locked(0), receivedBytes = Locked(0)
        let relayPID = Locked<Int32>(0)
        let upstream = try rawUpstream { connection in
            guard let head = try connection.readHead() else { return }
            try connection.write("HTTP/1.1 100 Continue\r\n\r\n")
            var left = Int(head.header("Content-Length") ?? "") ?? 0
            var reads = 0
            while left > 0 {
                let piece = try connection.readBody(min(left, 64 * 1024))
                left -= piece.count
                receivedBytes.withLock { $0 += piece.count }
                reads += 1
                // Slower than the client: without backpressure the relay would keep the difference.
                usleep(1000)
                if reads % 16 == 0, let rss = residentKiB(pid: relayPID.withLock { $0 }) { peakRSS.withLock { $0 = max($0, rss) } }
            }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        }
        let relay = try startTransportRelay(["upstream": ["url": upstream.baseURL]])
        relayPID.withLock { $0 = relay.pid }
        XCTAssertEqual(try get(relay, "/warm").status, 200)
        let idle = try XCTUnwrap(residentKiB(pid: relay.pid))
        peakRSS.withLock { $0 = idle }
        let client = try HTTPTestConnection(port: relay.proxyPort, timeout: 60)
        try client.writeRaw("POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \(total)\r\n\r\n")
        for _ in 0..<blocks { try client.writeRaw(block) }
        let response = try client.readResponse(requestMethod: "POST")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(receivedBytes.withLock { $0 }, total)
        let peak = peakRSS.withLock { $0 }
        print("slow upstream: idle RSS \(idle) KiB, peak \(peak) KiB during a 48 MiB upload")
        XCTAssertLessThan(peak - idle, 8 * 1024, "RSS grew from \(idle) KiB to \(peak) KiB")
    }

    /// The client's own `Expect: 100-continue` is answered when the body can flow (the upstream's 100),
    /// not when its head arrives.
    func testTheClientsOwnExpectIsAnsweredOnlyWhenTheBodyMayFlow() throws {
        let body = Self.pattern(2 * Self.mebibyte)
        let headArrived = TestSignal()
        let release = TestSignal()
        let received = Locked<(head: RecordedRequest?, body: Data?)>((nil, nil))
        let upstream = try rawUpstream { connection in
            guard let head = try connection.readHead() else { return }
            received.withLock { $0.head = head }
            headArrived.fire()
            guard release.wait(timeout: 20) else { return }
            try connection.write("HTTP/1.1 100 Continue\r\n\r\n")
            let bytes = try connection.readBody(Int(head.header("Content-Length") ?? "") ?? 0)
            received.withLock { $0.body = bytes }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        }
        let relay = try startTransportRelay(["upstream": ["url": upstream.baseURL], "limits": ["max_body_bytes": Self.mebibyte],
                                             "timeouts": ["continue_seconds": 30]])
        let client = try ClientSocket(port: relay.proxyPort, timeout: 20)
        try LoopbackSocket.writeAll(client.fd, Data(("POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                                                      + "Content-Length: \(body.count)\r\n\r\n").utf8))
        XCTAssertTrue(headArrived.wait(timeout: 10), "the head went upstream before the body")
        XCTAssertEqual(received.withLock { $0.head?.header("Expect") }, "100-continue")
        // The relay forwarded the head: a 100 sent at head time would be here already.
        var pending = pollfd(fd: client.fd, events: Int16(POLLIN), revents: 0)
        XCTAssertEqual(poll(&pending, 1, 300), 0, "100 Continue before the upstream asked for the body")
        release.fire()
        XCTAssertEqual(try client.reader.readLine(), "HTTP/1.1 100 Continue")
        XCTAssertEqual(try client.reader.readLine(), "")
        try LoopbackSocket.writeAll(client.fd, body)
        let status = try client.reader.readLine()
        XCTAssertEqual(status?.hasPrefix("HTTP/1.1 200"), true, status ?? "closed")
        XCTAssertTrue(waitUntil(timeout: 10) { received.withLock { $0.body } != nil })
        XCTAssertTrue(received.withLock { $0.body } == body, "the body arrived altered")
    }
}
