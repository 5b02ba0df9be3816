import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A blocking HTTP/1.1 client over POSIX sockets. Tests talk to the proxy through this rather than
/// URLSession so they control every byte (framing, header order, HTTP version, connection reuse)
/// and see the response exactly as sent, without a client library fixing it up.
enum HTTPTestClient {
    /// One request on a fresh connection. Adds `Host: 127.0.0.1:PORT`, `Content-Length` when there
    /// is a body, and `Connection: close`, each unless `headers` already has that field (pass
    /// `Transfer-Encoding: chunked` with a pre-chunked body to send a chunked request).
    static func send(port: Int, method: String, path: String, headers: [(String, String)] = [],
                     body: Data? = nil, httpVersion: String = "HTTP/1.1", timeout: Double = 10) throws -> TestHTTPResponse {
        let connection = try HTTPTestConnection(port: port, timeout: timeout)
        defer { connection.close() }
        var fields = headers
        if !fields.contains(where: { $0.0.lowercased() == "connection" }) { fields.append(("Connection", "close")) }
        return try connection.send(method: method, path: path, headers: fields, body: body, httpVersion: httpVersion)
    }

    /// Writes `bytes` verbatim and returns everything received until the peer closes, resets, or
    /// sends nothing for `timeout` seconds; what arrived so far is returned in all three cases
    /// (possibly empty). For malformed-request probes; throws only if connecting fails.
    static func sendRaw(port: Int, bytes: Data, timeout: Double = 5) throws -> Data {
        let fd = try LoopbackSocket.connect(port: port, timeout: timeout)
        defer { close(fd) }
        try? LoopbackSocket.writeAll(fd, bytes) // the peer may answer and close before reading it all
        return try SocketReader(fd: fd).readToEOF(lenient: true)
    }

    /// Runs `body(0..<n)` on `n` dedicated threads released together, so `n` requests really are
    /// in flight at once (DispatchQueue.concurrentPerform would cap parallelism at the core count).
    /// Results are in index order; a call still running after `timeout` yields a failure.
    static func concurrently<T: Sendable>(_ n: Int, timeout: Double = 60,
                                          _ body: @escaping @Sendable (Int) throws -> T) -> [Result<T, any Error>] {
        let results = ConcurrentResults<T>(n)
        let gate = DispatchSemaphore(value: 0)
        let group = DispatchGroup()
        for index in 0..<n {
            group.enter()
            Thread {
                _ = gate.wait(timeout: .now() + timeout) // start line: all threads exist before any runs
                let result = Result { try body(index) }
                results.lock.lock()
                results.values[index] = result
                results.lock.unlock()
                group.leave()
            }.start()
        }
        for _ in 0..<n { gate.signal() }
        _ = group.wait(timeout: .now() + timeout)
        results.lock.lock()
        defer { results.lock.unlock() }
        return results.values.map { $0 ?? .failure(TestSupportError("concurrently: call timed out after \(timeout) s")) }
    }
}

/// Result slots filled by `concurrently`'s threads; guarded by `lock`.
private final class ConcurrentResults<T: Sendable>: @unchecked Sendable {
    let lock = NSLock()
    var values: [Result<T, any Error>?]
    init(_ n: Int) { values = Array(repeating: nil, count: n) }
}

/// A client connection that can carry several requests (keep-alive and pipelining tests).
/// Not thread-safe: use one per thread. Adds `Host` and `Content-Length` like `HTTPTestClient.send`,
/// but no `Connection` header.
final class HTTPTestConnection {
    let port: Int
    private let socket: ClientSocket
    private var fd: Int32 { socket.fd }
    private var reader: SocketReader { socket.reader }

    init(port: Int, timeout: Double = 10) throws {
        self.port = port
        socket = try ClientSocket(port: port, timeout: timeout)
    }

    func close() { socket.close() }

    /// True once the server has closed its side (an orderly FIN or a reset); never blocks.
    var peerClosed: Bool {
        var byte: UInt8 = 0
        let received = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        return received == 0 || (received < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    }

    /// True when the server has sent something not read yet; never blocks.
    var hasBytes: Bool {
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) > 0
    }

    /// Writes bytes as they are (half a request, a body in pieces).
    func writeRaw(_ text: String) throws {
        try LoopbackSocket.writeAll(fd, Data(text.utf8))
    }

    func writeRaw(_ bytes: Data) throws {
        try LoopbackSocket.writeAll(fd, bytes)
    }

    func send(method: String, path: String, headers: [(String, String)] = [], body: Data? = nil,
              httpVersion: String = "HTTP/1.1") throws -> TestHTTPResponse {
        try write(method: method, path: path, headers: headers, body: body, httpVersion: httpVersion)
        return try readResponse(requestMethod: method)
    }

    /// Sends a request without waiting for the answer (pipelining); pair with `readResponse`.
    func write(method: String, path: String, headers: [(String, String)] = [], body: Data? = nil,
               httpVersion: String = "HTTP/1.1") throws {
        let has = { (name: String) in headers.contains { $0.0.lowercased() == name } }
        var fields = headers
        if !has("host") { fields.insert(("Host", "127.0.0.1:\(port)"), at: 0) }
        if let body, !has("content-length") && !has("transfer-encoding") { fields.append(("Content-Length", "\(body.count)")) }
        var bytes = Data("\(method) \(path) \(httpVersion)\r\n".utf8)
        for (name, value) in fields { bytes.append(Data("\(name): \(value)\r\n".utf8)) }
        bytes.append(Data("\r\n".utf8))
        if let body { bytes.append(body) }
        try LoopbackSocket.writeAll(fd, bytes)
    }

    /// Reads one final response (interim 1xx responses are skipped). The body is framed by
    /// chunked encoding, Content-Length, or else the connection closing.
    func readResponse(requestMethod: String = "GET") throws -> TestHTTPResponse {
        for _ in 0..<10 {
            guard let statusLine = try reader.readLine() else { throw TestSupportError("connection closed before a response") }
            let parts = statusLine.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/"), let status = Int(parts[1]) else {
                throw TestSupportError("bad status line: \(statusLine)")
            }
            let fields = try reader.readHeaderFields()
            if (100..<200).contains(status) && status != 101 { continue }
            let head = TestHTTPResponse(version: String(parts[0]), status: status,
                                        reason: parts.count > 2 ? String(parts[2]) : "", headers: fields,
                                        body: Data(), wasChunked: false)
            let chunked = head.headerTokens("Transfer-Encoding").last == "chunked"
            var body = Data()
            if requestMethod == "HEAD" || status == 204 || status == 304 || status == 101 {
            } else if chunked {
                body = try reader.readChunkedBody()
            } else if let length = head.header("Content-Length") {
                guard let count = Int(length.trimmingCharacters(in: .whitespaces)) else {
                    throw TestSupportError("bad Content-Length: \(length)")
                }
                body = try reader.readExactly(count)
            } else {
                body = try reader.readToEOF()
            }
            return TestHTTPResponse(version: head.version, status: status, reason: head.reason,
                                    headers: fields, body: body, wasChunked: chunked)
        }
        throw TestSupportError("too many interim responses")
    }
}
