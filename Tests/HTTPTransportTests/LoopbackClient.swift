import Foundation
import Glibc

/// A blocking TCP client on 127.0.0.1 for the transport tests, with a receive timeout so no test can hang.
final class LoopbackClient: @unchecked Sendable {
    let fd: Int32

    init(port: UInt16, timeoutSeconds: Int = 5) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else { throw ClientError("connect: \(String(cString: strerror(errno)))") }
    }

    deinit { close(fd) }

    func send(_ text: String) throws { try send(Array(text.utf8)) }

    func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { throw ClientError("write: \(String(cString: strerror(errno)))") }
            offset += n
        }
    }

    func shutdownWrite() { shutdown(fd, Int32(SHUT_WR)) }

    /// Reads one response: head, then a body by Content-Length, chunked, or until close.
    func readResponse() throws -> (status: Int, head: String, body: [UInt8]) {
        var buffer: [UInt8] = []
        var headEnd: Int?
        while headEnd == nil {
            guard try readMore(into: &buffer) else { throw ClientError("closed before a response head (\(buffer.count) bytes)") }
            headEnd = find([13, 10, 13, 10], in: buffer).map { $0 + 4 }
        }
        let head = String(decoding: buffer[0..<headEnd!], as: UTF8.self)
        var rest = Array(buffer[headEnd!...])
        pending = []
        let status = Int(head.split(separator: " ")[1]) ?? 0
        let lower = head.lowercased()
        if (100..<200).contains(status) {
            // An interim response has no body; the final one follows.
            pending = rest
            return (status, head, [])
        }
        if let range = lower.range(of: "content-length: ") {
            let length = Int(lower[range.upperBound...].prefix { $0.isNumber })!
            while rest.count < length { guard try readMore(into: &rest) else { throw ClientError("closed in the body") } }
            pending = Array(rest[length...])
            return (status, head, Array(rest[0..<length]))
        }
        if lower.contains("transfer-encoding: chunked") {
            var body: [UInt8] = []
            while true {
                var lineEnd = find([13, 10], in: rest)
                while lineEnd == nil { guard try readMore(into: &rest) else { throw ClientError("closed in a chunk size") }; lineEnd = find([13, 10], in: rest) }
                let size = Int(String(decoding: rest[0..<lineEnd!], as: UTF8.self), radix: 16)!
                let needed = lineEnd! + 2 + size + 2
                while rest.count < needed { guard try readMore(into: &rest) else { throw ClientError("closed in a chunk") } }
                body.append(contentsOf: rest[(lineEnd! + 2)..<(lineEnd! + 2 + size)])
                rest.removeFirst(needed)
                if size == 0 { pending = rest; return (status, head, body) }
            }
        }
        while try readMore(into: &rest) {}
        return (status, head, rest)
    }

    private var pending: [UInt8] = []

    /// Appends what the socket has (after any bytes left over from the previous response); false at EOF.
    private func readMore(into buffer: inout [UInt8]) throws -> Bool {
        if !pending.isEmpty {
            buffer.append(contentsOf: pending)
            pending = []
            return true
        }
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 { throw ClientError("read: \(String(cString: strerror(errno)))") }
        if n == 0 { return false }
        buffer.append(contentsOf: chunk[0..<n])
        return true
    }

    /// Whether any byte arrives within `seconds` (for "nothing was sent" checks; a byte read here is kept).
    func hasBytes(within seconds: Double) -> Bool {
        if !pending.isEmpty { return true }
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, Int32(seconds * 1000)) > 0 else { return false }
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n > 0 { pending = Array(chunk[0..<n]) }
        return true
    }

    /// True if the server closed the connection (EOF within the timeout).
    func readEOF() -> Bool {
        var byte: UInt8 = 0
        return read(fd, &byte, 1) == 0
    }

    private func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for i in 0...(haystack.count - needle.count) where Array(haystack[i..<(i + needle.count)]) == needle { return i }
        return nil
    }
}

struct ClientError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
