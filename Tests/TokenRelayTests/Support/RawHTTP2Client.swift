import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP/2 client that writes frames byte by byte as a test says (malformed, flooding, never
/// acknowledging), for the protocol-abuse tests. Field blocks are HPACK literals without indexing (no
/// table, no Huffman), so any name or value, however wrong, goes out exactly as written. It reads frames
/// back without decoding the server's field blocks.
final class RawHTTP2Client {
    struct Frame {
        let type: UInt8
        let flags: UInt8
        let stream: UInt32
        let payload: Data
        /// The error code of an RST_STREAM or GOAWAY.
        var errorCode: UInt32? {
            switch type {
            case RawHTTP2Client.rstStream where payload.count >= 4: return payload.prefix(4).reduce(0) { $0 << 8 | UInt32($1) }
            case RawHTTP2Client.goaway where payload.count >= 8: return payload.dropFirst(4).prefix(4).reduce(0) { $0 << 8 | UInt32($1) }
            default: return nil
            }
        }
    }

    static let data: UInt8 = 0, headers: UInt8 = 1, rstStream: UInt8 = 3, settings: UInt8 = 4, ping: UInt8 = 6, goaway: UInt8 = 7,
               windowUpdate: UInt8 = 8, continuation: UInt8 = 9
    static let endStream: UInt8 = 0x1, endHeaders: UInt8 = 0x4
    static let protocolError: UInt32 = 1, cancel: UInt32 = 8

    let socket: ClientSocket

    /// Connects and sends the preface and an empty SETTINGS (or `settings`: (identifier, value) pairs).
    init(port: Int, timeout: Double = 10, settings: [(UInt16, UInt32)] = [], receiveBuffer: Int32? = nil) throws {
        socket = try ClientSocket(port: port, timeout: timeout, receiveBuffer: receiveBuffer)
        LoopbackSocket.setTimeouts(socket.fd, seconds: timeout)
        var payload = Data()
        for (id, value) in settings {
            payload.append(contentsOf: [UInt8(id >> 8), UInt8(id & 0xff)])
            payload.append(contentsOf: (0..<4).map { UInt8(truncatingIfNeeded: value >> (24 - 8 * $0)) })
        }
        try write(Data("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + Self.frame(Self.settings, 0, 0, payload))
    }

    static func frame(_ type: UInt8, _ flags: UInt8, _ stream: UInt32, _ payload: Data) -> Data {
        let length = payload.count
        var bytes = Data([UInt8(length >> 16 & 0xff), UInt8(length >> 8 & 0xff), UInt8(length & 0xff), type, flags])
        bytes.append(contentsOf: (0..<4).map { UInt8(truncatingIfNeeded: (stream & 0x7fff_ffff) >> (24 - 8 * UInt32($0))) })
        bytes.append(payload)
        return bytes
    }

    private static func integer(_ value: Int, prefixBits: Int, flags: UInt8 = 0) -> [UInt8] {
        let limit = (1 << prefixBits) - 1
        if value < limit { return [flags | UInt8(value)] }
        var bytes = [flags | UInt8(limit)]
        var rest = value - limit
        while rest >= 128 {
            bytes.append(UInt8(rest & 127) | 128)
            rest >>= 7
        }
        bytes.append(UInt8(rest))
        return bytes
    }

    /// A field block of literals without indexing, new names.
    static func block(_ fields: [(String, String)]) -> Data {
        var bytes = Data()
        for (name, value) in fields {
            bytes.append(0)
            bytes.append(contentsOf: integer(name.utf8.count, prefixBits: 7))
            bytes.append(contentsOf: Array(name.utf8))
            bytes.append(contentsOf: integer(value.utf8.count, prefixBits: 7))
            bytes.append(contentsOf: Array(value.utf8))
        }
        return bytes
    }

    static func request(_ method: String = "GET", _ path: String = "/resource", extra: [(String, String)] = []) -> [(String, String)] {
        [(":method", method), (":scheme", "http"), (":authority", "127.0.0.1"), (":path", path)] + extra
    }

    func write(_ bytes: Data) throws { try LoopbackSocket.writeAll(socket.fd, bytes) }

    func sendHeaders(stream: UInt32, _ fields: [(String, String)], endStream: Bool) throws {
        try write(Self.frame(Self.headers, Self.endHeaders | (endStream ? Self.endStream : 0), stream, Self.block(fields)))
    }

    func sendData(stream: UInt32, _ bytes: Data, endStream: Bool) throws {
        try write(Self.frame(Self.data, endStream ? Self.endStream : 0, stream, bytes))
    }

    func sendReset(stream: UInt32, code: UInt32 = RawHTTP2Client.cancel) throws {
        try write(Self.frame(Self.rstStream, 0, stream, Data((0..<4).map { UInt8(truncatingIfNeeded: code >> (24 - 8 * UInt32($0))) })))
    }

    /// The next frame, or nil at the end of the connection (or when nothing came within the timeout).
    func readFrame() -> Frame? {
        guard let head = try? socket.reader.readExactly(9) else { return nil }
        let bytes = [UInt8](head)
        let length = Int(bytes[0]) << 16 | Int(bytes[1]) << 8 | Int(bytes[2])
        let stream = UInt32(bytes[5] & 0x7f) << 24 | UInt32(bytes[6]) << 16 | UInt32(bytes[7]) << 8 | UInt32(bytes[8])
        guard let payload = try? socket.reader.readExactly(length) else { return nil }
        return Frame(type: bytes[3], flags: bytes[4], stream: stream, payload: payload)
    }

    /// Frames until `stop` says so, the connection ends, or `limit` frames: what was read, and whether
    /// the connection ended.
    func readFrames(limit: Int = 100_000, until stop: (Frame) -> Bool = { _ in false }) -> (frames: [Frame], ended: Bool) {
        var frames: [Frame] = []
        while frames.count < limit {
            guard let frame = readFrame() else { return (frames, true) }
            frames.append(frame)
            if stop(frame) { return (frames, false) }
        }
        return (frames, false)
    }
}
