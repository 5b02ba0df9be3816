import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A client that reads a response piece by piece, for tests that care about *when* bytes arrive
/// (server-sent events, slow readers) rather than only what the whole response was.
final class StreamingClient {
    private let socket: ClientSocket
    var fd: Int32 { socket.fd }
    private var reader: SocketReader { socket.reader }
    private(set) var status = 0
    private(set) var headers: [(String, String)] = []

    /// `receiveBuffer` shrinks the kernel's socket buffer, so a slow reader really is slow for the sender.
    init(port: Int, timeout: Double = 10, receiveBuffer: Int32? = nil) throws {
        socket = try ClientSocket(port: port, timeout: timeout, receiveBuffer: receiveBuffer)
    }

    func close() { socket.close() }

    /// Sends a GET and reads the status line and headers.
    func get(_ path: String, port: Int) throws {
        try LoopbackSocket.writeAll(fd, Data("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n\r\n".utf8))
        guard let line = try reader.readLine() else { throw TestSupportError("closed before the status line") }
        status = Int(line.split(separator: " ")[1]) ?? 0
        headers = try reader.readHeaderFields()
    }

    /// The next chunk of a chunked body; nil at the final zero-size chunk.
    func readChunk() throws -> Data? {
        guard let line = try reader.readLine() else { throw TestSupportError("closed inside the chunked body") }
        guard let size = Int(line.split(separator: ";").first.map(String.init) ?? "", radix: 16) else {
            throw TestSupportError("bad chunk size line: \(line)")
        }
        if size == 0 {
            _ = try reader.readHeaderFields()
            return nil
        }
        let data = try reader.readExactly(size)
        guard try reader.readLine() == "" else { throw TestSupportError("chunk not followed by CRLF") }
        return data
    }

    /// Reads up to `count` raw bytes straight from the socket (0 at EOF), bypassing the line reader.
    /// Reads up to `count` body bytes, first those the head reader took ahead (a server may send the head
    /// and the start of the body in one write).
    func readRaw(upTo count: Int) throws -> Int {
        let buffered = reader.takeBuffered(upTo: count)
        if buffered > 0 { return buffered }
        var scratch = [UInt8](repeating: 0, count: count)
        while true {
            let n = scratch.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw TestSupportError(errnoContext: "recv") }
            return n
        }
    }
}

/// Resident set size of a process in KiB (VmRSS in /proc/PID/status).
func residentKiB(pid: Int32) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true)[1])
    }
    return nil
}
