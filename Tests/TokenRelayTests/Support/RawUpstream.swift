import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An upstream whose every connection is handled by test code over the raw socket: for responses
/// `MiniHTTPServer` deliberately cannot produce (chunked, server-sent events, generated 100 MiB bodies,
/// a body cut off mid-way, headers that never come, a keep-alive connection closed as a request
/// arrives). One thread per connection; `stop()` shuts every socket down, which wakes blocked handlers.
final class RawUpstream: Sendable {
    typealias Handler = @Sendable (RawUpstreamConnection) throws -> Void

    var port: Int { acceptor.port }
    var baseURL: String { "http://127.0.0.1:\(port)" }
    private let acceptor: LoopbackAcceptor

    /// Connections accepted so far / currently open.
    var acceptedConnections: Int { acceptor.acceptedConnections }
    var openConnections: Int { acceptor.openConnections }

    /// `backlog` 0 with nobody accepting makes connects hang once the queue is full (connect timeout tests).
    init(backlog: Int32 = 512, accepting: Bool = true, handler: @escaping Handler) throws {
        acceptor = try LoopbackAcceptor(backlog: backlog, accepting: accepting, socketTimeout: 60) { fd, id in
            try? handler(RawUpstreamConnection(fd: fd, id: id))
        }
    }

    func stop() { acceptor.stop() }
}

/// One accepted connection, as seen by a `RawUpstream` handler.
final class RawUpstreamConnection {
    let fd: Int32
    /// 1 for the first connection accepted, and so on.
    let id: Int
    private let reader: SocketReader

    init(fd: Int32, id: Int) {
        self.fd = fd
        self.id = id
        reader = SocketReader(fd: fd)
    }

    /// Reads one request (body framed by Content-Length); nil when the peer closed first.
    func readRequest() throws -> RecordedRequest? {
        guard let line = try reader.readLine() else { return nil }
        let parts = line.split(separator: " ")
        guard parts.count == 3 else { throw TestSupportError("bad request line: \(line)") }
        let headers = try reader.readHeaderFields()
        let length = headers.first { $0.0.lowercased() == "content-length" }.flatMap { Int($0.1) } ?? 0
        let body = try reader.readExactly(length)
        return RecordedRequest(method: String(parts[0]), target: String(parts[1]), version: String(parts[2]), headers: headers,
                               body: body, connectionID: id, wasChunked: false)
    }

    /// Reads a request head only (its body, if any, stays unread: for `Expect: 100-continue` tests).
    func readHead() throws -> RecordedRequest? {
        guard let line = try reader.readLine() else { return nil }
        let parts = line.split(separator: " ")
        guard parts.count == 3 else { throw TestSupportError("bad request line: \(line)") }
        return RecordedRequest(method: String(parts[0]), target: String(parts[1]), version: String(parts[2]),
                               headers: try reader.readHeaderFields(), body: Data(), connectionID: id, wasChunked: false)
    }

    /// Reads `count` body bytes.
    func readBody(_ count: Int) throws -> Data { try reader.readExactly(count) }

    func write(_ text: String) throws { try LoopbackSocket.writeAll(fd, Data(text.utf8)) }
    func write(_ data: Data) throws { try LoopbackSocket.writeAll(fd, data) }

    /// A chunk of a `Transfer-Encoding: chunked` body.
    func writeChunk(_ text: String) throws {
        try write(String(text.utf8.count, radix: 16) + "\r\n" + text + "\r\n")
    }

    /// Waits until the peer closes (or resets) the connection; false if it is still open after `timeout`.
    func waitForPeerClose(timeout: Double) -> Bool {
        let deadline = Date(timeIntervalSinceNow: timeout)
        var scratch = [UInt8](repeating: 0, count: 64 * 1024)
        while Date() < deadline {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 50) > 0 else { continue }
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN) { return true }
        }
        return false
    }

    /// Makes the close after the handler returns a reset instead of an orderly FIN (SO_LINGER 0), like
    /// a crashing upstream.
    func resetOnClose() {
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    }
}

/// A one-shot signal between a test and a server thread (bounded waits only).
final class TestSignal: @unchecked Sendable {
    private let semaphore = DispatchSemaphore(value: 0)
    func fire() { semaphore.signal() }
    @discardableResult
    func wait(timeout: Double) -> Bool { semaphore.wait(timeout: .now() + timeout) == .success }
}
