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

/// Copies the first `count` unconsumed bytes of `input` into `storage`, a connection's own array for the
/// head it hands to its handler. When the handler has let go of the previous head (the usual case: the
/// next message is read after the last exchange ended) the array is uniquely referenced and refilled in
/// place, so a keep-alive connection allocates no head array per message; a handler still holding it
/// keeps its copy, and copy-on-write gives the new head a new array. Like `HeadBuffer`, no more than an
/// ordinary head's memory is kept between messages.
func refillHeadBytes(_ storage: inout [UInt8], from input: InputBuffer, count: Int) {
    if storage.capacity > maxKeptHeadCapacity { storage = [] }
    // One replacement (not an empty-then-append, which is two passes through the general machinery).
    storage.replaceSubrange(0..<storage.count, with: UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(input.unconsumed)[0..<count]))
}

/// Serialises a response head with the framing fields the transport decides.
func serializeResponseHead(_ head: HTTPResponseHead, version: HTTPVersion, framing: ResponseFraming, close: Bool) -> [UInt8] {
    let out = HeadBuffer()
    withBytes(of: head.reason) { reason in
        writeResponseHead(into: out, status: head.status, reason: reason, version: version, framing: framing, close: close) { block in
            for field in head.fields { block.append(name: field.name, value: field.value) }
        }
    }
    return Array(out.bytes)
}

/// Appends a response head to `out`: the status line (controls dropped from the reason), the fields
/// `fields` adds (each checked, see `HTTPFieldBlock`), then the framing fields the transport decides.
func writeResponseHead(into out: HeadBuffer, status: Int, reason: UnsafeRawBufferPointer, version: HTTPVersion,
                       framing: ResponseFraming, close: Bool, fields: (inout HTTPFieldBlock) -> Void) {
    out.append(literal: "HTTP/1.1 ")
    out.appendDecimal(status)
    out.append(0x20)
    for b in reason where b >= 0x20 && b != 0x7F { out.append(b) }
    out.append(literal: "\r\n")
    var block = HTTPFieldBlock(writingInto: out)
    fields(&block)
    block.endField()
    switch framing {
    case .none, .closeDelimited: break
    case .length(let n):
        out.append(literal: "Content-Length: ")
        out.appendDecimal(n)
        out.append(literal: "\r\n")
    case .chunked:
        out.append(literal: "Transfer-Encoding: chunked\r\n")
    }
    if close {
        out.append(literal: "Connection: close\r\n")
    } else if version == .http10 {
        out.append(literal: "Connection: keep-alive\r\n")
    }
    out.append(literal: "\r\n")
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
    withBytes(of: name) { name in withBytes(of: value) { value in isSendableFieldName(name) && hasNoControls(value) } }
}

/// A token (HTTPWire's `isToken`), and not a framing field (Content-Length, Transfer-Encoding,
/// Connection) in any case.
func isSendableFieldName(_ name: UnsafeRawBufferPointer) -> Bool {
    guard isToken(name) else { return false }
    switch name.count {
    case 10: return !asciiEqualIgnoringCase(name, "connection")
    case 14: return !asciiEqualIgnoringCase(name, "content-length")
    case 17: return !asciiEqualIgnoringCase(name, "transfer-encoding")
    default: return true
    }
}

/// tchar only (RFC 9110 section 5.6.2): HTTPWire's check, eight bytes at a time where it can.
func isToken(_ bytes: UnsafeRawBufferPointer) -> Bool {
    HTTPWire.isToken(bytes)
}

/// No control but HTAB, no DEL (HTTPWire's `isFieldValue`, eight bytes at a time): no value can end a
/// line or the head early.
func hasNoControls(_ bytes: UnsafeRawBufferPointer) -> Bool {
    isFieldValue(bytes)
}

/// `name` equals `lowercase` (which must be lower-case ASCII) ignoring ASCII case, without copying either.
func asciiEqualIgnoringCase(_ name: String, _ lowercase: StaticString) -> Bool {
    withBytes(of: name) { asciiEqualIgnoringCase($0, lowercase) }
}

func asciiEqualIgnoringCase(_ name: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
    guard name.count == lowercase.utf8CodeUnitCount else { return false }
    return lowercase.withUTF8Buffer { wanted in
        for i in 0..<wanted.count {
            let x = name[i]
            if ((x >= 0x41 && x <= 0x5A) ? x | 0x20 : x) != wanted[i] { return false }
        }
        return true
    }
}

/// Calls `body` with a string's UTF-8 bytes in place (a copy only for a string not stored contiguously).
func withBytes<R>(of string: String, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    if let result = string.utf8.withContiguousStorageIfAvailable({ body(UnsafeRawBufferPointer($0)) }) { return result }
    return Array(string.utf8).withUnsafeBytes(body)
}
