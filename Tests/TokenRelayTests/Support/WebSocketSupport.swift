import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Just enough RFC 6455 for the upgrade tests: the handshake's accept value, frames (masked from the
/// client, unmasked from the server), text, binary, close and ping.
enum WebSocketFrame {
    static let text: UInt8 = 1
    static let binary: UInt8 = 2
    static let close: UInt8 = 8
    static let ping: UInt8 = 9
    static let pong: UInt8 = 10

    /// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 §4.2.2).
    static func accept(for key: String) -> String {
        Data(SHA1.digest(Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))).base64EncodedString()
    }

    /// The head of a final frame with this payload length (the payload follows, masked with `mask`).
    static func head(opcode: UInt8, length: Int, mask: [UInt8]?) -> [UInt8] {
        var out: [UInt8] = [0x80 | opcode]
        let maskBit: UInt8 = mask == nil ? 0 : 0x80
        if length < 126 {
            out.append(maskBit | UInt8(length))
        } else if length <= 0xFFFF {
            out.append(maskBit | 126)
            out += [UInt8(length >> 8), UInt8(length & 0xFF)]
        } else {
            out.append(maskBit | 127)
            out += (0..<8).reversed().map { UInt8((length >> ($0 * 8)) & 0xFF) }
        }
        if let mask { out += mask }
        return out
    }

    static func encode(opcode: UInt8, payload: [UInt8], masked: Bool) -> [UInt8] {
        guard masked else { return head(opcode: opcode, length: payload.count, mask: nil) + payload }
        let mask: [UInt8] = (0..<4).map { _ in UInt8.random(in: 0...255) }
        return head(opcode: opcode, length: payload.count, mask: mask) + payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
    }

    /// Reads a frame's head: opcode, payload length and mask (nil for server frames).
    static func readHead(_ reader: SocketReader) throws -> (opcode: UInt8, length: Int, mask: [UInt8]?) {
        let first = [UInt8](try reader.readExactly(2))
        var length = Int(first[1] & 0x7F)
        if length == 126 {
            length = [UInt8](try reader.readExactly(2)).reduce(0) { $0 << 8 | Int($1) }
        } else if length == 127 {
            length = [UInt8](try reader.readExactly(8)).reduce(0) { $0 << 8 | Int($1) }
        }
        guard first[0] & 0x80 != 0 else { throw TestSupportError("fragmented frames are not used in these tests") }
        let mask = first[1] & 0x80 != 0 ? [UInt8](try reader.readExactly(4)) : nil
        return (first[0] & 0x0F, length, mask)
    }

    /// A whole frame, unmasked.
    static func read(_ reader: SocketReader) throws -> (opcode: UInt8, payload: [UInt8]) {
        let head = try readHead(reader)
        var payload = [UInt8](try reader.readExactly(head.length))
        if let mask = head.mask { for i in payload.indices { payload[i] ^= mask[i % 4] } }
        return (head.opcode, payload)
    }
}

/// SHA-1 (FIPS 180-4), for the handshake's accept value only.
enum SHA1 {
    static func digest(_ message: [UInt8]) -> [UInt8] {
        var h: [UInt32] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0]
        var data = message + [0x80]
        while data.count % 64 != 56 { data.append(0) }
        let bits = UInt64(message.count) * 8
        data += (0..<8).reversed().map { UInt8((bits >> (UInt64($0) * 8)) & 0xFF) }
        for block in stride(from: 0, to: data.count, by: 64) {
            var w = [UInt32](repeating: 0, count: 80)
            for i in 0..<16 {
                w[i] = (0..<4).reduce(UInt32(0)) { $0 << 8 | UInt32(data[block + i * 4 + $1]) }
            }
            for i in 16..<80 {
                let x = w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]
                w[i] = x << 1 | x >> 31
            }
            var (a, b, c, d, e) = (h[0], h[1], h[2], h[3], h[4])
            for i in 0..<80 {
                let (f, k): (UInt32, UInt32) = switch i {
                case 0..<20: ((b & c) | (~b & d), 0x5A827999)
                case 20..<40: (b ^ c ^ d, 0x6ED9EBA1)
                case 40..<60: ((b & c) | (b & d) | (c & d), 0x8F1BBCDC)
                default: (b ^ c ^ d, 0xCA62C1D6)
                }
                let temp = (a << 5 | a >> 27) &+ f &+ e &+ k &+ w[i]
                (e, d, c, b, a) = (d, c, b << 30 | b >> 2, a, temp)
            }
            h[0] &+= a; h[1] &+= b; h[2] &+= c; h[3] &+= d; h[4] &+= e
        }
        return h.flatMap { word in (0..<4).reversed().map { UInt8((word >> (UInt32($0) * 8)) & 0xFF) } }
    }
}

/// A WebSocket echo server that demands a valid bearer token on the handshake (401 + WWW-Authenticate
/// otherwise, on the same keep-alive connection). After the 101: text and binary messages are echoed;
/// "big N" is answered with one binary message of N bytes; "close-me" makes the server close (close
/// frame, wait for the client's, then the TCP close); a client's close frame is answered and the
/// connection closed; a ping gets a pong.
final class WebSocketEchoUpstream: Sendable {
    private struct State {
        var handshakes: [[(String, String)]] = []
        var unauthorized = 0
        var closes: [String] = []
    }
    private let upstream: RawUpstream
    private let state = Locked(State())

    var baseURL: String { upstream.baseURL }
    /// Header fields of each accepted handshake.
    var handshakes: [[(String, String)]] { state.withLock { $0.handshakes } }
    var unauthorized: Int { state.withLock { $0.unauthorized } }
    /// "client" or "server" per WebSocket closed, in order.
    var closes: [String] { state.withLock { $0.closes } }
    var openConnections: Int { upstream.openConnections }

    init(validateToken: @escaping @Sendable (String) -> Bool) throws {
        let state = self.state
        upstream = try RawUpstream { connection in
            let reader = SocketReader(fd: connection.fd)
            while let line = try reader.readLine() {
                guard line.hasPrefix("GET ") else { throw TestSupportError("not a GET: \(line)") }
                let fields = try reader.readHeaderFields()
                func field(_ name: String) -> String? { fields.first { $0.0.lowercased() == name }?.1 }
                let token = field("authorization").flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
                guard let token, validateToken(token) else {
                    state.withLock { $0.unauthorized += 1 }
                    try connection.write("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: 0\r\n\r\n")
                    continue
                }
                guard field("upgrade")?.lowercased() == "websocket",
                      field("connection")?.lowercased().contains("upgrade") == true,
                      field("sec-websocket-version") == "13", let key = field("sec-websocket-key") else {
                    try connection.write("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    continue
                }
                state.withLock { $0.handshakes.append(fields) }
                try connection.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                     + "Sec-WebSocket-Accept: \(WebSocketFrame.accept(for: key))\r\n\r\n")
                try Self.echo(connection, reader, state)
                return
            }
        }
    }

    private static func send(_ connection: RawUpstreamConnection, _ opcode: UInt8, _ payload: [UInt8]) throws {
        try connection.write(Data(WebSocketFrame.encode(opcode: opcode, payload: payload, masked: false)))
    }

    private static func echo(_ connection: RawUpstreamConnection, _ reader: SocketReader, _ state: Locked<State>) throws {
        while true {
            let frame = try WebSocketFrame.read(reader)
            let text = String(decoding: frame.payload, as: UTF8.self)
            switch frame.opcode {
            case WebSocketFrame.close:
                try send(connection, WebSocketFrame.close, frame.payload)
                state.withLock { $0.closes.append("client") }
                return
            case WebSocketFrame.ping:
                try send(connection, WebSocketFrame.pong, frame.payload)
            case WebSocketFrame.text where text == "close-me":
                try send(connection, WebSocketFrame.close, [0x03, 0xE8])
                while try WebSocketFrame.read(reader).opcode != WebSocketFrame.close {}
                state.withLock { $0.closes.append("server") }
                return
            case WebSocketFrame.text where text.hasPrefix("big "):
                let size = Int(text.dropFirst(4)) ?? 0
                try connection.write(Data(WebSocketFrame.head(opcode: WebSocketFrame.binary, length: size, mask: nil)))
                let block = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
                var left = size
                while left > 0 {
                    let piece = min(left, block.count)
                    try connection.write(piece == block.count ? block : block.prefix(piece))
                    left -= piece
                }
            default:
                try send(connection, frame.opcode, frame.payload)
            }
        }
    }

    func stop() { upstream.stop() }
}

/// A WebSocket client over a plain socket to the relay.
final class WebSocketTestClient {
    let socket: ClientSocket
    var reader: SocketReader { socket.reader }
    static let key = "dGhlIHNhbXBsZSBub25jZQ=="

    init(port: Int, timeout: Double = 10, receiveBuffer: Int32? = nil) throws {
        socket = try ClientSocket(port: port, timeout: timeout, receiveBuffer: receiveBuffer)
    }

    /// Sends the opening handshake; returns the status and header fields of the answer (for a 101 the
    /// connection is then a WebSocket; another answer's body is read and dropped).
    func handshake(path: String = "/socket") throws -> (status: Int, fields: [(String, String)]) {
        let request = "GET \(path) HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(Self.key)\r\nSec-WebSocket-Version: 13\r\nOrigin: http://legacy.example\r\n\r\n"
        try LoopbackSocket.writeAll(socket.fd, Data(request.utf8))
        guard let statusLine = try reader.readLine() else { throw TestSupportError("closed before the handshake answer") }
        let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") ?? 0
        let fields = try reader.readHeaderFields()
        if status != 101, let length = fields.first(where: { $0.0.lowercased() == "content-length" }).flatMap({ Int($0.1) }) {
            _ = try reader.readExactly(length)
        }
        return (status, fields)
    }

    func send(_ opcode: UInt8, _ payload: [UInt8]) throws {
        try LoopbackSocket.writeAll(socket.fd, Data(WebSocketFrame.encode(opcode: opcode, payload: payload, masked: true)))
    }

    func sendText(_ text: String) throws { try send(WebSocketFrame.text, Array(text.utf8)) }

    func readFrame() throws -> (opcode: UInt8, payload: [UInt8]) { try WebSocketFrame.read(reader) }

    /// True when the relay closed the connection (EOF within the socket's timeout).
    func readsEOF() -> Bool {
        (try? reader.readToEOF())?.isEmpty ?? false
    }
}
