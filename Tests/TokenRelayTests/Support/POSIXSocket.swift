import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The one error type of the test-support code. Carries errno text where there is one, so a
/// failure in a CI log says what actually went wrong ("connect: Connection refused").
struct TestSupportError: Error, CustomStringConvertible {
    let description: String
    /// True for a socket read that hit its SO_RCVTIMEO (the peer sent nothing in time).
    let isTimeout: Bool
    init(_ description: String, isTimeout: Bool = false) {
        self.description = description
        self.isTimeout = isTimeout
    }
    init(errnoContext context: String, code: Int32 = errno) {
        self.init("\(context): \(String(cString: strerror(code)))")
    }
}

/// Loopback TCP sockets. Everything binds 127.0.0.1 port 0 so tests never collide on ports, and
/// every socket is close-on-exec so the product child process never inherits a fake server's
/// listener (which would keep the port alive after the fake is stopped).
enum LoopbackSocket {
    static func listen(backlog: Int32 = 512) throws -> (fd: Int32, port: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError(errnoContext: "socket") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = loopbackAddress(port: 0)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, Glibc.listen(fd, backlog) == 0 else {
            let error = TestSupportError(errnoContext: "bind/listen 127.0.0.1:0")
            close(fd)
            throw error
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return (fd, Int(UInt16(bigEndian: addr.sin_port)))
    }

    /// Connects to 127.0.0.1:`port`. `timeout` bounds connect, every send and every recv.
    static func connect(port: Int, timeout: Double) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError(errnoContext: "socket") }
        setTimeouts(fd, seconds: timeout)
        var addr = loopbackAddress(port: port)
        let result = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let error = TestSupportError(errnoContext: "connect 127.0.0.1:\(port)")
            close(fd)
            throw error
        }
        return fd
    }

    /// SO_RCVTIMEO/SO_SNDTIMEO: a blocked recv/send fails with EAGAIN instead of hanging the test.
    static func setTimeouts(_ fd: Int32, seconds: Double) {
        var tv = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - Double(Int(seconds))) * 1_000_000))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Writes all of `data`. MSG_NOSIGNAL: a peer that hung up must yield an error, not SIGPIPE,
    /// which would kill the whole test process.
    static func writeAll(_ fd: Int32, _ data: Data) throws {
        try data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { throw TestSupportError(errnoContext: "send") }
                offset += n
            }
        }
    }

    private static func loopbackAddress(port: Int) -> sockaddr_in {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        return addr
    }
}

/// Buffered reading of HTTP/1.x framing from a blocking socket. Shared by the fake servers and the
/// test client so both sides parse exactly the same way. All reads are size-limited, so a broken
/// peer produces an error instead of unbounded memory growth.
final class SocketReader {
    private let fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0

    /// Takes the bytes read ahead of what was parsed so far (a body piece that came with the head).
    func takeBuffered(upTo count: Int) -> Int {
        let taken = min(count, buffer.count - start)
        start += taken
        return taken
    }
    static let maxLine = 64 * 1024
    static let maxBody = 512 * 1024 * 1024

    init(fd: Int32) { self.fd = fd }

    /// Reads more bytes into the buffer; false on orderly EOF.
    private func fill() throws -> Bool {
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: true); start = 0
        } else if start > 1 << 20 { // keep-alive connections must not grow the buffer forever
            buffer.removeFirst(start); start = 0
        }
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { throw TestSupportError("recv: timed out", isTimeout: true) }
            guard n >= 0 else { throw TestSupportError(errnoContext: "recv") }
            buffer.append(contentsOf: chunk[0..<n])
            return n > 0
        }
    }

    /// One CRLF- (or bare LF-) terminated line without the terminator; nil on EOF before any byte.
    func readLine() throws -> String? {
        var scanned = 0 // bytes after `start` known to hold no LF (fill() may move `start`)
        while true {
            if let nl = buffer[(start + scanned)...].firstIndex(of: UInt8(ascii: "\n")) {
                var end = nl
                if end > start && buffer[end - 1] == UInt8(ascii: "\r") { end -= 1 }
                let line = String(decoding: buffer[start..<end], as: UTF8.self)
                start = nl + 1
                return line
            }
            scanned = buffer.count - start
            guard buffer.count - start <= Self.maxLine else { throw TestSupportError("line too long") }
            guard try fill() else {
                if start == buffer.count { return nil }
                throw TestSupportError("connection closed in the middle of a line")
            }
        }
    }

    func readExactly(_ count: Int) throws -> Data {
        guard count >= 0 && count <= Self.maxBody else { throw TestSupportError("bad body size \(count)") }
        while buffer.count - start < count {
            guard try fill() else { throw TestSupportError("connection closed after \(buffer.count - start) of \(count) body bytes") }
        }
        defer { start += count }
        return Data(buffer[start..<start + count])
    }

    /// Everything until the peer closes. When `lenient`, a read timeout or a reset also ends the
    /// read and what arrived so far is returned (raw probes against servers that keep the
    /// connection open, or that answer and reset).
    func readToEOF(lenient: Bool = false) throws -> Data {
        while buffer.count - start <= Self.maxBody {
            do { guard try fill() else { break } } catch where lenient { break }
        }
        guard buffer.count - start <= Self.maxBody else { throw TestSupportError("body too large") }
        defer { start = buffer.count }
        return Data(buffer[start...])
    }

    /// Header fields up to the empty line, in order, duplicates kept.
    func readHeaderFields() throws -> [(String, String)] {
        var fields: [(String, String)] = []
        while true {
            guard let line = try readLine() else { throw TestSupportError("connection closed inside the header") }
            if line.isEmpty { return fields }
            guard fields.count < 1000, let colon = line.firstIndex(of: ":") else {
                throw TestSupportError("malformed header line: \(line)")
            }
            fields.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
        }
    }

    /// A `Transfer-Encoding: chunked` body (RFC 9112 §7.1); chunk extensions and trailers are skipped.
    func readChunkedBody() throws -> Data {
        var body = Data()
        while true {
            guard let line = try readLine() else { throw TestSupportError("connection closed inside chunked body") }
            let sizeText = line.split(separator: ";", maxSplits: 1).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
            guard let size = Int(sizeText, radix: 16), size >= 0 else { throw TestSupportError("bad chunk size line: \(line)") }
            if size == 0 {
                _ = try readHeaderFields() // trailer section, ends with the empty line
                return body
            }
            guard body.count + size <= Self.maxBody else { throw TestSupportError("chunked body too large") }
            body.append(try readExactly(size))
            guard try readLine() == "" else { throw TestSupportError("chunk not followed by CRLF") }
        }
    }
}
