import Foundation
import HTTPTransport
import XCTest

/// The plain byte stream (what fleet mode's Redis client runs on): bytes both ways over TCP and a unix
/// socket, written before the connect finished; the peer's close and failed connects reported once, from
/// the loop, never inside the call that started them.
final class ByteStreamConnectionTests: LoopThreadTestCase {
    /// What the connection reported, recorded from the loop thread.
    private final class Recorder: @unchecked Sendable {
        let signal = DispatchSemaphore(value: 0)
        private let lock = NSLock()
        private var _received: [UInt8] = []
        private var _events: [String] = []
        var received: [UInt8] { lock.withLock { _received } }
        var events: [String] { lock.withLock { _events } }

        func note(_ event: String) {
            lock.withLock { _events.append(event) }
            signal.signal()
        }

        func receive(_ bytes: UnsafeRawBufferPointer) {
            lock.withLock { _received += bytes }
            signal.signal()
        }

        func attach(_ connection: ByteStreamConnection) {
            connection.onConnected = { [self] in note("connected") }
            connection.onBytes = { [self] in receive($0) }
            connection.onClosed = { [self] in note("closed \($0.stage) \($0.description)") }
        }
    }

    func testBytesTravelBothWaysOverTCPAndAUnixSocket() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("bytestream-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let servers = [try EchoServer(tcp: ()), try EchoServer(unixPath: directory.appendingPathComponent("echo.sock").path)]
        for server in servers {
            let recorder = Recorder()
            let loop = loopThread.loop
            let connection: ByteStreamConnection? = loopThread.sync {
                let connection = try? ByteStreamConnection(loop: loop, to: server.destination, connectTimeout: 5)
                connection.map(recorder.attach)
                // Written before the connect completed: queued and sent in order once open.
                connection?.write(Array("hello ".utf8))
                connection?.write(Array("world".utf8))
                return connection
            }
            XCTAssertNotNil(connection)
            XCTAssertTrue(waitUntil(recorder.signal) { recorder.received.count == 11 }, "\(server.destination): \(recorder.events)")
            XCTAssertEqual(String(decoding: recorder.received, as: UTF8.self), "hello world")
            XCTAssertEqual(recorder.events.first, "connected")
            loopThread.sync { connection?.write(Array("quit".utf8)) }
            XCTAssertTrue(waitUntil(recorder.signal) { recorder.events.count == 2 }, "\(recorder.events)")
            XCTAssertTrue(recorder.events.last?.hasPrefix("closed transfer ") ?? false, "\(recorder.events)")
            XCTAssertTrue(recorder.events.last?.hasSuffix("closed the connection") ?? false, "\(recorder.events)")
            loopThread.sync { connection?.close() }
            server.stop()
        }
    }

    func testFailedConnectsAreReportedOnceFromTheLoop() throws {
        let refusedPort = try EchoServer.unusedLoopbackPort()
        let cases: [(ByteStreamConnection.Destination, String)] = [
            (.tcp(host: "127.0.0.1", port: refusedPort), "closed connect connect 127.0.0.1:\(refusedPort): Connection refused"),
            (.unix(path: "/nonexistent/tokenrelay.sock"), "closed connect connect /nonexistent/tokenrelay.sock: No such file or directory"),
        ]
        for (destination, expected) in cases {
            let recorder = Recorder()
            let loop = loopThread.loop
            let (connection, reportedInsideInit): (ByteStreamConnection?, Bool) = loopThread.sync {
                let connection = try? ByteStreamConnection(loop: loop, to: destination, connectTimeout: 5)
                connection.map(recorder.attach)
                connection?.write(Array("x".utf8))
                return (connection, !recorder.events.isEmpty)
            }
            XCTAssertNotNil(connection)
            XCTAssertFalse(reportedInsideInit, "reported inside the owner's own call")
            XCTAssertTrue(waitUntil(recorder.signal) { !recorder.events.isEmpty }, "\(destination)")
            XCTAssertEqual(recorder.events, [expected])
            loopThread.sync { connection?.close() }
        }
        let loop = loopThread.loop
        let tooLong: String? = loopThread.sync { () -> String? in
            do {
                _ = try ByteStreamConnection(loop: loop, to: .unix(path: "/" + String(repeating: "a", count: 200)))
                return nil
            } catch {
                return "\(error)"
            }
        }
        XCTAssertTrue(tooLong?.contains("not a usable unix socket path") ?? false, tooLong ?? "no error")
    }
}

/// Accepts one connection and echoes what it reads, until it reads "quit" (then closes) or the peer closes.
/// Blocking sockets on a thread of its own; stopped by closing its sockets.
final class EchoServer: @unchecked Sendable {
    let destination: ByteStreamConnection.Destination
    private let listener: Int32
    private let done = DispatchSemaphore(value: 0)

    convenience init(tcp: Void) throws {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard fd >= 0, bound == 0, listen(fd, 4) == 0 else { throw FixtureError("cannot listen on 127.0.0.1") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        self.init(listener: fd, destination: .tcp(host: "127.0.0.1", port: UInt16(bigEndian: address.sin_port)))
    }

    convenience init(unixPath path: String) throws {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        guard fd >= 0, bound == 0, listen(fd, 4) == 0 else { throw FixtureError("cannot listen on \(path)") }
        self.init(listener: fd, destination: .unix(path: path))
    }

    private init(listener: Int32, destination: ByteStreamConnection.Destination) {
        self.listener = listener
        self.destination = destination
        Thread { [self] in
            serve()
            done.signal()
        }.start()
    }

    private func serve() {
        let client = accept(listener, nil, nil)
        guard client >= 0 else { return }
        defer { close(client) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = read(client, &buffer, buffer.count)
            guard n > 0 else { return }
            let chunk = Array(buffer[0..<n])
            if String(decoding: chunk, as: UTF8.self).contains("quit") { return }
            _ = chunk.withUnsafeBytes { write(client, $0.baseAddress, n) }
        }
    }

    /// Stops accepting (the serving thread ends once its client has gone).
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        _ = done.wait(timeout: .now() + 5)
    }

    /// A loopback port nothing listens on (bound and released at once).
    static func unusedLoopbackPort() throws -> UInt16 {
        let server = try EchoServer(tcp: ())
        guard case .tcp(_, let port) = server.destination else { return 0 }
        server.stop()
        return port
    }
}
