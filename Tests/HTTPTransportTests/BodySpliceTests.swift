import Foundation
import Glibc
import HTTPTransport
import HTTPWire
import XCTest

/// A minimal relay on the test's loop: each client request goes to the upstream through a pool, and the
/// response comes back with the body spliced when `HTTPClientConnection.spliceBody` agrees.
final class SpliceTestRelay: HTTPServerConnectionHandler, HTTPClientConnectionHandler, @unchecked Sendable {
    let signal = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var _events: [String] = []
    private var _splicedResponses = 0
    private var _upstreamsClosed = 0
    var events: [String] { lock.withLock { _events } }
    /// Responses whose body went by splice (summed over upstream connections, when each response or
    /// connection ends).
    var splicedResponses: Int { lock.withLock { _splicedResponses } }
    var upstreamsClosed: Int { lock.withLock { _upstreamsClosed } }

    private(set) var server: HTTPServer!
    private(set) var pool: UpstreamPool!
    private var exchanges: [ObjectIdentifier: HTTPClientConnection] = [:]
    private var clients: [ObjectIdentifier: HTTPServerConnection] = [:]
    private var upstreamPaused: Set<ObjectIdentifier> = []
    var splicing = true

    /// Call on the loop thread.
    func start(loop: TransportLoop, upstreamPort: UInt16, sendTimeout: Double = 0) throws {
        pool = UpstreamPool(loop: loop, host: "127.0.0.1", port: upstreamPort)
        server = try HTTPServer(loop: loop, host: "127.0.0.1", port: 0, settings: HTTPServer.Settings(sendTimeout: sendTimeout)) { [unowned self] connection in
            connection.handler = self
            connection.halfCloseEndsTheConnection = true
        }
    }

    private func note(_ event: String) {
        lock.withLock { _events.append(event) }
        signal.signal()
    }

    func count(_ prefix: String) -> Int { events.filter { $0.hasPrefix(prefix) }.count }

    // Client side
    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        let target = Array(head.target)
        let method = head.methodName
        _ = pool.acquire(lane: .arriving) { [weak self, weak connection] result in
            guard let self, let connection, case .success(let upstream) = result else { return }
            self.exchanges[ObjectIdentifier(upstream)] = upstream
            self.clients[ObjectIdentifier(upstream)] = connection
            upstream.handler = self
            upstream.startRequest(method: method, target: target, fields: [("Host", "upstream")], body: .none)
            upstream.finishRequest()
        }
    }
    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
    func connectionReceivedEnd(_ connection: HTTPServerConnection) {}
    func connectionCanSendMore(_ connection: HTTPServerConnection) {
        for (key, client) in clients where client === connection && upstreamPaused.contains(key) {
            upstreamPaused.remove(key)
            exchanges[key]?.resumeReading()
        }
    }
    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        note("client ended \(ended)")
        for (key, client) in clients where client === connection {
            clients[key] = nil
            if let upstream = exchanges.removeValue(forKey: key) {
                countSplices(upstream)
                upstream.handler = nil
                upstream.close()
                lock.withLock { _upstreamsClosed += 1 }
            }
        }
    }

    // Upstream side
    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        guard let client = clients[ObjectIdentifier(connection)] else { return }
        splicedBefore[ObjectIdentifier(connection)] = connection.splicedResponses
        let length: BodyLength
        switch head.framing {
        case .length(let n): length = .known(n)
        case .none: length = .none
        default: length = .unknown
        }
        client.startResponse(HTTPResponseHead(status: head.status, reason: "OK"), body: length)
        if splicing, case .known = length { _ = connection.spliceBody(to: client) }
    }
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        let key = ObjectIdentifier(connection)
        guard let client = clients[key] else { return }
        client.sendBody(bytes)
        if !client.canSendMore && !upstreamPaused.contains(key) {
            upstreamPaused.insert(key)
            connection.pauseReading()
        }
    }
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        let key = ObjectIdentifier(connection)
        let client = clients.removeValue(forKey: key)
        exchanges[key] = nil
        upstreamPaused.remove(key)
        countSplices(connection)
        connection.handler = nil
        pool.release(connection)
        client?.finishResponse()
        note("response end reusable=\(connection.isReusable)")
    }
    /// `splicedResponses` of each upstream connection when its response head came.
    private var splicedBefore: [ObjectIdentifier: Int] = [:]

    private func countSplices(_ connection: HTTPClientConnection) {
        guard let before = splicedBefore.removeValue(forKey: ObjectIdentifier(connection)) else { return }
        lock.withLock { _splicedResponses += connection.splicedResponses - before }
    }
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        let key = ObjectIdentifier(connection)
        exchanges[key] = nil
        upstreamPaused.remove(key)
        countSplices(connection)
        note("upstream ended \(ended)")
        // As a proxy does: a response cut short cuts the client's connection.
        if let client = clients.removeValue(forKey: key) { client.close() }
    }

    func stop() {
        server?.close()
        server = nil
        for upstream in exchanges.values { upstream.close() }
        exchanges.removeAll()
        clients.removeAll()
        pool = nil
    }
}

/// An upstream that answers each request head on a connection with a Content-Length head and then the
/// bytes `body(n)` gives, closing after `closeAfter` body bytes if set (a response cut short).
final class RawLengthUpstream: @unchecked Sendable {
    let port: UInt16
    private let fd: Int32

    init(length: Int, closeAfter: Int) {
        let (fd, port) = try! LoopbackListener.open()
        self.fd = fd
        self.port = port
        let listener = fd
        Thread {
            let client = accept(listener, nil, nil)
            guard client >= 0 else { return }
            var tv = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            _ = LoopbackListener.readHead(client)
            var out = Array("HTTP/1.1 200 OK\r\nContent-Length: \(length)\r\n\r\n".utf8)
            out.append(contentsOf: expectedPattern(closeAfter))
            var offset = 0
            while offset < out.count {
                let n = out[offset...].withUnsafeBytes { write(client, $0.baseAddress, $0.count) }
                if n <= 0 { break }
                offset += n
            }
            close(client)
        }.start()
    }

    func stop() {
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }
}

final class BodySpliceTests: XCTestCase {
    private var loopThread: LoopThread!
    private var upstream: TransportTestServer!
    private var relay: SpliceTestRelay!

    override func setUpWithError() throws {
        loopThread = try LoopThread()
    }

    override func tearDown() {
        if let relay { loopThread.sync { relay.stop() } }
        loopThread.stop()
        upstream?.stop()
        loopThread = nil
        relay = nil
        upstream = nil
    }

    private func startRelay(upstreamPort: UInt16? = nil, sendTimeout: Double = 0) throws -> UInt16 {
        if upstreamPort == nil { upstream = try TransportTestServer() }
        let relay = SpliceTestRelay()
        self.relay = relay
        let loop = loopThread.loop
        let port = upstreamPort ?? upstream.port
        let error: Error? = loopThread.sync {
            do { try relay.start(loop: loop, upstreamPort: port, sendTimeout: sendTimeout) } catch { return error }
            return nil
        }
        if let error { throw error }
        return loopThread.sync { relay.server.port }
    }

    private func fetch(_ client: LoopbackClient, _ size: Int) throws -> [UInt8] {
        try client.send("GET /known?\(size) HTTP/1.1\r\nHost: relay\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        return response.body
    }

    func testFourMebibytesArriveByteIdenticalThroughTheSplice() throws {
        let port = try startRelay()
        let client = try LoopbackClient(port: port)
        let body = try fetch(client, 4 << 20)
        XCTAssertEqual(body.count, 4 << 20)
        XCTAssertTrue(body == expectedPattern(4 << 20))
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("response end") == 1 })
        XCTAssertEqual(relay.splicedResponses, 1)
    }

    func testSixtyFourMebibytesArriveByteIdenticalThroughTheSplice() throws {
        let port = try startRelay()
        let client = try LoopbackClient(port: port, timeoutSeconds: 20)
        let size = 64 << 20
        try client.send("GET /known?\(size) HTTP/1.1\r\nHost: relay\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.body.count, size)
        let block = patternBlock
        var equal = true
        response.body.withUnsafeBytes { body in
            block.withUnsafeBytes { block in
                var offset = 0
                while offset < size && equal {
                    let n = min(block.count, size - offset)
                    equal = memcmp(body.baseAddress! + offset, block.baseAddress!, n) == 0
                    offset += n
                }
            }
        }
        XCTAssertTrue(equal, "the spliced body differs from what the upstream sent")
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("response end") == 1 })
        XCTAssertEqual(relay.splicedResponses, 1)
    }

    /// After a spliced body the upstream connection is back in the pool, reusable, and carries the next
    /// request; the client's connection stays open for its next request.
    func testKeepAliveContinuesAfterASplicedBody() throws {
        let port = try startRelay()
        let client = try LoopbackClient(port: port)
        XCTAssertTrue(try fetch(client, 1 << 20) == expectedPattern(1 << 20))
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("response end") == 1 })
        XCTAssertEqual(relay.events.last, "response end reusable=true")
        XCTAssertEqual(loopThread.sync { [relay] in relay!.pool.idleCount }, 1)
        XCTAssertTrue(try fetch(client, 2 << 20) == expectedPattern(2 << 20))
        XCTAssertTrue(try fetch(client, 100) == expectedPattern(100))
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("response end") == 3 })
        XCTAssertEqual(relay.splicedResponses, 2, "the 100-byte body goes the normal way")
        XCTAssertEqual(loopThread.sync { [relay] in relay!.pool.openCount }, 1, "one upstream connection for all three")
        XCTAssertEqual(relay.count("client ended"), 0)
    }

    /// Two requests in one write: the second is answered after the spliced first, in order.
    func testPipelinedRequestIsAnsweredAfterASplicedResponse() throws {
        let port = try startRelay()
        let client = try LoopbackClient(port: port)
        try client.send("GET /known?3000000 HTTP/1.1\r\nHost: relay\r\n\r\nGET /known?1500000 HTTP/1.1\r\nHost: relay\r\n\r\n")
        let first = try client.readResponse()
        let second = try client.readResponse()
        XCTAssertTrue(first.body == expectedPattern(3_000_000))
        XCTAssertTrue(second.body == expectedPattern(1_500_000))
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("response end") == 2 })
        XCTAssertEqual(relay.splicedResponses, 2)
    }

    /// The upstream closes after part of the body: the client's connection is closed (its response cut
    /// short, never completed by a later one), the upstream connection is not pooled.
    func testUpstreamClosingMidBodyClosesTheClient() throws {
        let raw = RawLengthUpstream(length: 8 << 20, closeAfter: 3 << 20)
        defer { raw.stop() }
        let port = try startRelay(upstreamPort: raw.port)
        let client = try LoopbackClient(port: port)
        try client.send("GET /cut HTTP/1.1\r\nHost: relay\r\n\r\n")
        XCTAssertThrowsError(try client.readResponse()) { error in
            XCTAssertTrue("\(error)".contains("closed in the body"), "\(error)")
        }
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("upstream ended") == 1 }, "\(relay.events)")
        XCTAssertTrue(relay.events.contains("upstream ended peerClosed"), "\(relay.events)")
        XCTAssertEqual(relay.splicedResponses, 1)
        XCTAssertEqual(relay.count("response end"), 0)
        XCTAssertEqual(loopThread.sync { [relay] in relay!.pool.openCount }, 0)
    }

    /// The client goes away mid-body: the upstream connection is closed, not returned to the pool.
    func testClientClosingMidBodyClosesTheUpstream() throws {
        let port = try startRelay()
        var client: LoopbackClient? = try LoopbackClient(port: port)
        try client?.send("GET /known?\(64 << 20) HTTP/1.1\r\nHost: relay\r\n\r\n")
        // Some of the body first, so that the splice is under way.
        var got = 0
        var chunk = [UInt8](repeating: 0, count: 65536)
        while got < 2 << 20 {
            let n = chunk.withUnsafeMutableBytes { read(client!.fd, $0.baseAddress, $0.count) }
            XCTAssertGreaterThan(n, 0)
            if n <= 0 { break }
            got += n
        }
        client = nil   // closes the socket with unread bytes: a reset
        XCTAssertTrue(waitUntil(relay.signal) { relay.count("client ended") == 1 }, "\(relay.events)")
        XCTAssertTrue(waitUntil(relay.signal) { self.loopThread.sync { [relay] in relay!.pool.openCount } == 0 }, "\(relay.events)")
        XCTAssertEqual(relay.count("response end"), 0)
        XCTAssertEqual(relay.splicedResponses, 1)
        XCTAssertEqual(loopThread.sync { [relay] in relay!.pool.idleCount }, 0)
    }

    /// A client reading slowly: the relay holds at most a pipe and the sockets' buffers, not the body.
    /// The client reads 48 MiB of a 64 MiB body in small bites with a small receive buffer, and the
    /// process's memory does not grow with what passed through.
    func testSlowClientKeepsMemoryFlat() throws {
        let port = try startRelay()
        let client = try LoopbackClient(port: port, timeoutSeconds: 20)
        var small: Int32 = 16 * 1024
        setsockopt(client.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        try client.send("GET /known?\(64 << 20) HTTP/1.1\r\nHost: relay\r\n\r\n")
        var chunk = [UInt8](repeating: 0, count: 4096)
        var got = 0
        var baseline = 0
        var peak = 0
        while got < 48 << 20 {
            let n = chunk.withUnsafeMutableBytes { read(client.fd, $0.baseAddress, $0.count) }
            XCTAssertGreaterThan(n, 0)
            if n <= 0 { break }
            got += n
            if got >= 4 << 20 && baseline == 0 { baseline = residentBytes() }
            if baseline > 0 && got % (1 << 20) < 4096 { peak = max(peak, residentBytes()) }
        }
        XCTAssertGreaterThan(baseline, 0)
        XCTAssertLessThan(peak - baseline, 16 << 20, "memory grew by \((peak - baseline) >> 20) MiB while 44 MiB passed")
        XCTAssertEqual(relay.count("client ended"), 0)
    }

    /// A client that takes nothing for `sendTimeout` seconds while the splice holds bytes for it is cut, as
    /// on the copying path, and the upstream connection with it.
    func testSendStallLimitAppliesToASplicedBody() throws {
        let port = try startRelay(sendTimeout: 0.5)
        let client = try LoopbackClient(port: port)
        var small: Int32 = 16 * 1024
        setsockopt(client.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        try client.send("GET /known?\(64 << 20) HTTP/1.1\r\nHost: relay\r\n\r\n")
        XCTAssertTrue(waitUntil(relay.signal, timeout: 10) { relay.count("client ended") == 1 }, "\(relay.events)")
        XCTAssertTrue(relay.events.contains("client ended failed(errno: \(ETIMEDOUT))"), "\(relay.events)")
        XCTAssertTrue(waitUntil(relay.signal) { self.loopThread.sync { [relay] in relay!.pool.openCount } == 0 })
        XCTAssertEqual(relay.splicedResponses, 1)
    }
}

/// VmRSS of this process in bytes.
private func residentBytes() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        let digits = line.filter { $0.isNumber }
        return (Int(digits) ?? 0) * 1024
    }
    return 0
}
