import Foundation
import Glibc
import HTTPTransport
import HTTPWire
import TLSFixtures
import XCTest

/// A minimal upgrading relay on the transport: a request asking for an upgrade is sent upstream with
/// `upgrade:`; on the upstream's 101 both connections are detached and joined by a `ByteTunnel`.
final class TunnelRelay: HTTPServerConnectionHandler, HTTPClientConnectionHandler, @unchecked Sendable {
    let loopThread: LoopThread
    private(set) var server: HTTPServer!
    private let upstreamPort: UInt16
    private let tls: TransportTLSClientContext?
    private let settings: ByteTunnel.Settings
    private var clients: [ObjectIdentifier: HTTPServerConnection] = [:]
    private var pairs: [ObjectIdentifier: HTTPServerConnection] = [:]
    private var upstreams: [HTTPClientConnection] = []
    private let lock = NSLock()
    private var _ends: [ByteTunnel.End] = []
    let signal = DispatchSemaphore(value: 0)

    var ends: [ByteTunnel.End] { lock.withLock { _ends } }
    var openConnections: Int { loopThread.sync { self.server.openConnections } }

    init(loopThread: LoopThread, upstreamPort: UInt16, tls: TransportTLSClientContext? = nil,
         settings: ByteTunnel.Settings = ByteTunnel.Settings()) throws {
        self.loopThread = loopThread
        self.upstreamPort = upstreamPort
        self.tls = tls
        self.settings = settings
        let loop = loopThread.loop
        server = try loopThread.sync { () -> HTTPServer? in
            try? HTTPServer(loop: loop, host: "127.0.0.1", port: 0, settings: HTTPServer.Settings()) { [unowned self] connection in
                self.clients[ObjectIdentifier(connection)] = connection
                connection.handler = self
            }
        }.unwrap()
    }

    var port: UInt16 { server.port }

    func stop() {
        loopThread.sync { self.server.close() }
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {}
    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {}

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        guard connection.requestAsksForUpgrade,
              let upstream = try? HTTPClientConnection(loop: loopThread.loop, host: "127.0.0.1", port: upstreamPort, tls: tls) else {
            connection.respond(HTTPResponseHead(status: 400, reason: "Bad Request"), body: [])
            return
        }
        upstream.handler = self
        upstreams.append(upstream)
        pairs[ObjectIdentifier(upstream)] = connection
        upstream.startRequest(method: "GET", target: Array("/chat".utf8), fields: [("Host", "upstream")], body: .none, upgrade: "echo")
        upstream.finishRequest()
    }

    func connectionCanSendMore(_ connection: HTTPServerConnection) {}

    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        clients[ObjectIdentifier(connection)] = nil
    }

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}

    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        guard let client = pairs.removeValue(forKey: ObjectIdentifier(connection)) else { return }
        guard head.status == 101, connection.hasSwitchedProtocols, let upstreamEnd = connection.detachForTunnel(),
              let clientEnd = client.switchProtocols(HTTPResponseHead(status: 101, reason: "Switching Protocols",
                                                                     fields: [("Upgrade", head.field("upgrade") ?? "")])) else {
            client.respond(HTTPResponseHead(status: 502, reason: "Bad Gateway"), body: [])
            connection.close()
            return
        }
        upstreams.removeAll { $0 === connection }
        _ = ByteTunnel(loop: loopThread.loop, clientEnd, upstreamEnd, settings: settings) { [self] end in
            lock.withLock { _ends.append(end) }
            signal.signal()
        }
    }

    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {}
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        if let client = pairs.removeValue(forKey: ObjectIdentifier(connection)) {
            client.respond(HTTPResponseHead(status: 502, reason: "Bad Gateway"), body: [])
        }
    }
}

extension Optional {
    func unwrap(_ what: String = "value") throws -> Wrapped {
        guard let self else { throw ClientError("no \(what)") }
        return self
    }
}

/// A plain-TCP upstream that answers one upgrade request with 101 + "early" in the same write, then
/// either echoes until the relay's FIN (then sends "bye" and closes) or sends `flood` bytes first.
final class RawUpgradeUpstream: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32
    private let lock = NSLock()
    private var _head = ""
    private var _sent = 0
    private var _sawEOF = false
    private let finished = DispatchSemaphore(value: 0)

    var head: String { lock.withLock { _head } }
    var sent: Int { lock.withLock { _sent } }
    var sawEOF: Bool { lock.withLock { _sawEOF } }

    init(flood: Int = 0, closeAfterEarly: Bool = false) throws {
        let (listening, boundPort) = try LoopbackListener.open()
        listener = listening
        port = boundPort
        let fd = listening
        Thread { [self] in
            defer { finished.signal() }
            var tv = timeval(tv_sec: 20, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            let client = accept(fd, nil, nil)
            guard client >= 0 else { return }
            defer { close(client) }
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var buffer = [UInt8](repeating: 0, count: 65536)
            var request: [UInt8] = []
            while !String(decoding: request, as: UTF8.self).contains("\r\n\r\n") {
                let n = buffer.withUnsafeMutableBytes { read(client, $0.baseAddress, $0.count) }
                guard n > 0 else { return }
                request.append(contentsOf: buffer[0..<n])
            }
            let text = String(decoding: request, as: UTF8.self)
            let headText = String(text[..<text.range(of: "\r\n\r\n")!.lowerBound])
            lock.withLock { _head = headText }
            guard writeAll(client, Array("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nearly".utf8)) else { return }
            // Bytes the relay sent behind the request head are echoed like the rest.
            let behind = Array(request[(headText.utf8.count + 4)...])
            if !behind.isEmpty { _ = writeAll(client, behind) }
            if closeAfterEarly {
                shutdown(client, Int32(SHUT_WR))
            }
            if flood > 0 {
                let piece = [UInt8](repeating: 0x61, count: 65536)
                var left = flood
                while left > 0 {
                    let n = piece.withUnsafeBytes { write(client, $0.baseAddress, min(left, $0.count)) }
                    guard n > 0 else { return }
                    left -= n
                    lock.withLock { _sent += n }
                }
            }
            while true {
                let n = buffer.withUnsafeMutableBytes { read(client, $0.baseAddress, $0.count) }
                if n == 0 {
                    lock.withLock { _sawEOF = true }
                    if !closeAfterEarly { _ = writeAll(client, Array("bye".utf8)) }
                    return
                }
                guard n > 0 else { return }
                if !closeAfterEarly { _ = writeAll(client, Array(buffer[0..<n])) }
            }
        }.start()
    }

    func waitFinished() -> Bool { finished.wait(timeout: .now() + 20) == .success }

    deinit { close(listener) }
}

private func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return false }
        offset += n
    }
    return true
}

extension LoopbackClient {
    /// Sends on another thread (the echo comes back while the rest is still being sent: sending it all
    /// before reading could fill every buffer on the way and stall both).
    func sendInBackground(_ bytes: [UInt8]) -> DispatchSemaphore {
        let done = DispatchSemaphore(value: 0)
        Thread { [self] in
            try? send(bytes)
            done.signal()
        }.start()
        return done
    }

    /// Reads until `count` bytes have arrived (or EOF / the timeout); returns what came.
    func readExactly(_ count: Int) -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while result.count < count {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, min($0.count, count - result.count)) }
            guard n > 0 else { break }
            result.append(contentsOf: chunk[0..<n])
        }
        return result
    }

    /// Reads the 101 head byte by byte (so that nothing behind it is consumed).
    func readHead() -> String {
        var head: [UInt8] = []
        var byte: UInt8 = 0
        while !head.suffix(4).elementsEqual([13, 10, 13, 10]) {
            guard read(fd, &byte, 1) == 1 else { break }
            head.append(byte)
        }
        return String(decoding: head, as: UTF8.self)
    }
}

final class ByteTunnelTests: LoopThreadTestCase {
    private let handshake = "GET /chat HTTP/1.1\r\nHost: relay\r\nConnection: keep-alive, Upgrade\r\nUpgrade: echo\r\n\r\n"

    /// The upstream sees Upgrade and `Connection: Upgrade`; the client gets the 101 with both; the bytes
    /// that came with the 101 and those the client sent right behind its head get through; messages go
    /// both ways; the client's FIN reaches the upstream, whose answer and FIN come back; the tunnel ends
    /// once as `closed`, and the client connection counts against the server until then.
    func testRelaysBothWaysWithEarlyBytesAndHalfClose() throws {
        let upstream = try RawUpgradeUpstream()
        let relay = try TunnelRelay(loopThread: loopThread, upstreamPort: upstream.port)
        defer { relay.stop() }
        let client = try LoopbackClient(port: relay.port)
        try client.send(handshake + "first")
        let head = client.readHead()
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 101 "), head)
        XCTAssertTrue(head.contains("Upgrade: echo\r\n"), head)
        XCTAssertTrue(head.contains("Connection: Upgrade\r\n"), head)
        XCTAssertEqual(String(decoding: client.readExactly(10), as: UTF8.self), "earlyfirst")
        XCTAssertTrue(upstream.head.contains("\r\nUpgrade: echo\r\n"), upstream.head)
        XCTAssertTrue(upstream.head.hasSuffix("\r\nConnection: Upgrade"), upstream.head)
        XCTAssertEqual(relay.openConnections, 1, "a tunnel's client connection still counts")
        for message in ["second", String(repeating: "x", count: 200_000)] {
            let sent = client.sendInBackground(Array(message.utf8))
            XCTAssertEqual(String(decoding: client.readExactly(message.utf8.count), as: UTF8.self), message)
            XCTAssertEqual(sent.wait(timeout: .now() + 10), .success)
        }
        client.shutdownWrite()
        XCTAssertEqual(String(decoding: client.readExactly(3), as: UTF8.self), "bye", "the other direction works after a half-close")
        XCTAssertTrue(client.readEOF())
        XCTAssertTrue(upstream.sawEOF)
        XCTAssertTrue(waitUntil(relay.signal) { !relay.ends.isEmpty })
        XCTAssertEqual(relay.ends, [.closed])
        XCTAssertTrue(waitUntil(relay.signal, timeout: 5) { relay.openConnections == 0 })
    }

    /// The upstream closes first (after "early"): the client sees the FIN, and its own close ends the tunnel.
    func testUpstreamCloseReachesTheClient() throws {
        let upstream = try RawUpgradeUpstream(closeAfterEarly: true)
        let relay = try TunnelRelay(loopThread: loopThread, upstreamPort: upstream.port)
        defer { relay.stop() }
        let client = try LoopbackClient(port: relay.port)
        try client.send(handshake)
        XCTAssertTrue(client.readHead().hasPrefix("HTTP/1.1 101 "))
        XCTAssertEqual(String(decoding: client.readExactly(5), as: UTF8.self), "early")
        XCTAssertTrue(client.readEOF(), "the upstream's FIN is passed on")
        client.shutdownWrite()
        XCTAssertTrue(waitUntil(relay.signal) { !relay.ends.isEmpty })
        XCTAssertEqual(relay.ends, [.closed])
        XCTAssertTrue(upstream.waitFinished())
        XCTAssertTrue(upstream.sawEOF)
    }

    /// A client that does not read holds the upstream back: the relay stops reading it, so the upstream's
    /// writes block far short of the whole flood; once the client reads, every byte arrives.
    func testBackpressureHoldsTheSenderBack() throws {
        let flood = 48 << 20
        let upstream = try RawUpgradeUpstream(flood: flood)
        let relay = try TunnelRelay(loopThread: loopThread, upstreamPort: upstream.port,
                                    settings: ByteTunnel.Settings(bufferLimit: 64 * 1024))
        defer { relay.stop() }
        let client = try LoopbackClient(port: relay.port, timeoutSeconds: 20)
        var small: Int32 = 64 * 1024
        setsockopt(client.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        try client.send(handshake)
        XCTAssertTrue(client.readHead().hasPrefix("HTTP/1.1 101 "))
        // Polled with a deadline: the upstream's progress stops (its socket is full and nobody reads it).
        var last = -1
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            let now = upstream.sent
            if now == last && now > 0 { break }
            last = now
            _ = DispatchSemaphore(value: 0).wait(timeout: .now() + 0.3)   // the sampling interval of this poll
        }
        XCTAssertLessThan(upstream.sent, 24 << 20, "the upstream was not held back")
        var received = client.readExactly(5 + flood).count
        XCTAssertEqual(received, 5 + flood)
        XCTAssertEqual(upstream.sent, flood)
        client.shutdownWrite()
        received = client.readExactly(3).count
        XCTAssertEqual(received, 3)
        XCTAssertTrue(waitUntil(relay.signal, timeout: 10) { !relay.ends.isEmpty })
        XCTAssertEqual(relay.ends, [.closed])
    }

    /// No byte either way within the idle timeout: both sides are closed, the end says why.
    func testIdleTimeoutClosesBothSides() throws {
        let upstream = try RawUpgradeUpstream()
        let relay = try TunnelRelay(loopThread: loopThread, upstreamPort: upstream.port,
                                    settings: ByteTunnel.Settings(idleTimeout: 0.3))
        defer { relay.stop() }
        let client = try LoopbackClient(port: relay.port)
        try client.send(handshake)
        XCTAssertTrue(client.readHead().hasPrefix("HTTP/1.1 101 "))
        XCTAssertEqual(String(decoding: client.readExactly(5), as: UTF8.self), "early")
        XCTAssertTrue(client.readEOF())
        XCTAssertTrue(waitUntil(relay.signal) { !relay.ends.isEmpty })
        XCTAssertEqual(relay.ends, [.idleTimeout])
        XCTAssertTrue(upstream.waitFinished())
    }

    /// Over TLS to the upstream: the first bytes come in the 101's record, messages go both ways, and the
    /// client's FIN becomes close_notify + FIN upstream, after which the upstream's last bytes still arrive.
    func testTunnelOverTLSUpstream() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        let tls = try TransportTLSClientContext(caFile: pki.caFile.path, serverName: "localhost")
        let relay = try TunnelRelay(loopThread: loopThread, upstreamPort: upstream.port, tls: tls)
        defer { relay.stop() }
        let client = try LoopbackClient(port: relay.port, timeoutSeconds: 10)
        try client.send(handshake)
        let head = client.readHead()
        XCTAssertTrue(head.hasPrefix("HTTP/1.1 101 "), head + upstream.stderrText)
        XCTAssertEqual(String(decoding: client.readExactly(5), as: UTF8.self), "early")
        let big = (0..<3_000_000).map { UInt8($0 % 251) }
        let sent = client.sendInBackground(big)
        XCTAssertEqual(client.readExactly(big.count), big)
        XCTAssertEqual(sent.wait(timeout: .now() + 10), .success)
        client.shutdownWrite()
        XCTAssertEqual(String(decoding: client.readExactly(3), as: UTF8.self), "bye")
        XCTAssertTrue(client.readEOF())
        XCTAssertTrue(waitUntil(relay.signal) { !relay.ends.isEmpty })
        XCTAssertEqual(relay.ends, [.closed])
    }

    /// An endpoint can only be had after a 101 (client side) or for a request that asked (server side).
    func testDetachingNeedsASwitch() throws {
        let upstream = try RawUpgradeUpstream()
        let relay = try TunnelRelay(loopThread: loopThread, upstreamPort: upstream.port)
        defer { relay.stop() }
        let client = try LoopbackClient(port: relay.port)
        try client.send("GET /plain HTTP/1.1\r\nHost: relay\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 400, "a request without Upgrade cannot switch")
        let loop = loopThread.loop
        let detached = loopThread.sync { () -> Bool in
            let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: upstream.port)
            defer { connection?.close() }
            return connection?.detachForTunnel() != nil
        }
        XCTAssertFalse(detached)
    }
}
