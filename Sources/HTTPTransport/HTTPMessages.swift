import HTTPWire

/// A request head as received: one copy of its bytes and the offsets HTTPWire found in them. Fields are
/// read in place; nothing is allocated per field.
public struct ReceivedRequestHead: Sendable {
    public let bytes: [UInt8]
    public let parsed: RequestHead

    public var method: HTTPMethod { parsed.method }
    public var version: HTTPVersion { parsed.semantics.version }
    public var framing: BodyFraming { parsed.semantics.framing }
    public var targetForm: TargetForm { parsed.targetForm }
    public var expectsContinue: Bool { parsed.expectsContinue }
    public var keepAlive: Bool { parsed.semantics.keepAlive }

    /// The method as sent (for methods outside `HTTPMethod`'s named cases).
    public var methodName: String { String(decoding: bytes[parsed.methodBytes], as: UTF8.self) }

    /// The request target's bytes, unchanged.
    public var target: ArraySlice<UInt8> { bytes[parsed.target] }

    /// Calls `body` with each field's name and value, in order, as slices of `bytes`.
    public func forEachField(_ body: (ArraySlice<UInt8>, ArraySlice<UInt8>) -> Void) {
        for field in parsed.fields { body(bytes[field.name], bytes[field.value]) }
    }

    /// The first field with this name (ASCII case-insensitive), decoded as text.
    public func field(_ name: String) -> String? {
        let wanted = Array(name.utf8)
        for field in parsed.fields where asciiEqualIgnoringCase(bytes[field.name], wanted) {
            return String(decoding: bytes[field.value], as: UTF8.self)
        }
        return nil
    }
}

/// The head of a response to send. Framing fields (Content-Length, Transfer-Encoding, Connection) are the
/// transport's: it writes them from `BodyLength` and the connection's state, and refuses them here.
public struct HTTPResponseHead: Sendable {
    public var status: Int
    public var reason: String
    public var fields: [(name: String, value: String)]

    public init(status: Int, reason: String, fields: [(name: String, value: String)] = []) {
        self.status = status
        self.reason = reason
        self.fields = fields
    }
}

/// How the body of an outgoing message is delimited.
public enum BodyLength: Sendable, Equatable {
    case none
    case known(Int)
    /// Chunked to HTTP/1.1 peers; close-delimited to HTTP/1.0 peers.
    case unknown
}

/// Why a connection ended.
public enum ConnectionEnd: Sendable, Equatable {
    /// This side closed it (after an answer that ends the connection, or `close()`).
    case closedLocally
    /// The peer closed its side.
    case peerClosed
    /// A read or write failed with this errno.
    case failed(errno: Int32)
    /// The peer sent something HTTP/1.1 does not allow; it was answered with an error status.
    case protocolError(HTTPWireError)
    /// A request head did not arrive completely within the head timeout; it was answered with 408.
    case headTimeout
    /// An upstream sent bytes after a complete response (a second response in the same write, a body on
    /// a 304) or while no request was outstanding: the connection was closed, never reused. Worth
    /// counting and logging: it is either a broken upstream or an attempt at response desync.
    case unsolicitedBytes
    /// The peer stayed silent longer than a limit while a message was under way: an upstream past the
    /// connection's silence limit, or a client whose request body stalled past the server's body timeout
    /// (answered 408 if no response had started). The connection was closed.
    case timedOut
    /// A client connection waited for its next request longer than the server's idle timeout and was
    /// closed without an answer (the ordinary end of an unused keep-alive connection).
    case idleTimeout
    /// The server's connection limit left no slot for this connection's request: it was answered with
    /// the server's over-limit response (503) and closed; the handler never saw the request.
    case refusedOverLimit
    /// The request body was larger than the server's hard cap (`HTTPServer.Settings.maxBodyBytes`):
    /// answered 413 if no response had started, and closed.
    case bodyTooLarge
    /// An upstream connection was never established: the name did not resolve, no address accepted the
    /// connect, the TLS handshake failed (certificate verification, an alert from the peer), or all of
    /// that took longer than the connect timeout. Nothing of the request reached the upstream. The text
    /// names the cause ("cannot resolve api.example: name does not exist").
    case connectFailed(String)
}

func asciiEqualIgnoringCase(_ a: ArraySlice<UInt8>, _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    var i = a.startIndex
    for byte in b {
        let x = a[i]
        let lowerX = (x >= 0x41 && x <= 0x5A) ? x | 0x20 : x
        let lowerY = (byte >= 0x41 && byte <= 0x5A) ? byte | 0x20 : byte
        if lowerX != lowerY { return false }
        i += 1
    }
    return true
}

/// Serialises a response head with the framing fields the transport decides.
func serializeResponseHead(_ head: HTTPResponseHead, version: HTTPVersion, framing: ResponseFraming, close: Bool) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(128 + head.fields.count * 32)
    out.appendASCII("HTTP/1.1 ")
    out.appendUTF8(String(head.status))
    out.append(0x20)
    for b in head.reason.utf8 where b >= 0x20 && b != 0x7F { out.append(b) }
    out.appendASCII("\r\n")
    for field in head.fields where isSendableField(field.name, field.value) {
        out.appendUTF8(field.name)
        out.appendASCII(": ")
        out.appendUTF8(field.value)
        out.appendASCII("\r\n")
    }
    switch framing {
    case .none, .closeDelimited: break
    case .length(let n):
        out.appendASCII("Content-Length: ")
        out.appendUTF8(String(n))
        out.appendASCII("\r\n")
    case .chunked:
        out.appendASCII("Transfer-Encoding: chunked\r\n")
    }
    if close {
        out.appendASCII("Connection: close\r\n")
    } else if version == .http10 {
        out.appendASCII("Connection: keep-alive\r\n")
    }
    out.appendASCII("\r\n")
    return out
}

enum ResponseFraming: Equatable {
    case none
    case length(Int)
    case chunked
    case closeDelimited
}

/// A field the transport may write: a token name, a value without CR, LF, NUL or other controls (so that
/// no value can end the head early), and not one of the framing fields the transport writes itself.
/// Called for every field of every head sent, so it reads the bytes in place and allocates nothing.
func isSendableField(_ name: String, _ value: String) -> Bool {
    let nameIsToken = name.utf8.withContiguousStorageIfAvailable(isToken) ?? isToken(Array(name.utf8))
    guard nameIsToken else { return false }
    let valueIsClean = value.utf8.withContiguousStorageIfAvailable(hasNoControls) ?? hasNoControls(Array(value.utf8))
    guard valueIsClean else { return false }
    return !(asciiEqualIgnoringCase(name, "content-length") || asciiEqualIgnoringCase(name, "transfer-encoding")
        || asciiEqualIgnoringCase(name, "connection"))
}

private func isToken<C: Collection<UInt8>>(_ bytes: C) -> Bool {
    guard !bytes.isEmpty else { return false }
    for b in bytes {
        switch b {
        case 0x61...0x7A, 0x41...0x5A, 0x30...0x39, 0x21, 0x23, 0x24, 0x25, 0x26, 0x27, 0x2A, 0x2B, 0x2D, 0x2E, 0x5E, 0x5F, 0x60, 0x7C, 0x7E:
            continue
        default:
            return false
        }
    }
    return true
}

private func hasNoControls<C: Collection<UInt8>>(_ bytes: C) -> Bool {
    for b in bytes where (b < 0x20 && b != 0x09) || b == 0x7F { return false }
    return true
}

/// `name` equals `lowercase` (which must be lower-case ASCII) ignoring ASCII case, without copying either.
func asciiEqualIgnoringCase(_ name: String, _ lowercase: StaticString) -> Bool {
    let utf8 = name.utf8
    guard utf8.count == lowercase.utf8CodeUnitCount else { return false }
    return lowercase.withUTF8Buffer { wanted in
        var i = 0
        for x in utf8 {
            let lowerX = (x >= 0x41 && x <= 0x5A) ? x | 0x20 : x
            if lowerX != wanted[i] { return false }
            i &+= 1
        }
        return true
    }
}

extension Array where Element == UInt8 {
    /// Appends a string's UTF-8 bytes with one copy (appending a `String.UTF8View` goes byte by byte).
    mutating func appendUTF8(_ string: String) {
        let copied: Void? = string.utf8.withContiguousStorageIfAvailable { append(contentsOf: $0) }
        if copied == nil { append(contentsOf: string.utf8) }
    }

    /// Appends a literal's bytes with one copy.
    mutating func appendASCII(_ literal: StaticString) {
        literal.withUTF8Buffer { append(contentsOf: $0) }
    }
}
