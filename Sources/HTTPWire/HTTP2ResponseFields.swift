/// An HTTP/2 upstream's header block (a response head, an interim 1xx head or trailers), as it arrives from
/// the HPACK decoder, turned into an HTTP/1.1 response head that `HeadParser` then reads like any
/// upstream's (so every HTTP/1.1 check applies to it too):
/// - `:status` makes the status line (with the reason phrase the caller gives: HTTP/2 has none); it is
///   kept only when it is three digits, otherwise the head has no status and the parser refuses it;
/// - other pseudo-headers never become field lines (nghttp2 refuses them in a response anyway);
/// - a body without `content-length` is framed `transfer-encoding: chunked`, and a response that ended
///   with its HEADERS `content-length: 0` (HTTP/2 frames a body by DATA and END_STREAM; the layers above
///   read framing from the head), except where a response has no body at all (to HEAD, 204, 304).
/// The block is measured as HTTP/1.1 field lines (name, value and 4 per field); past `maxBytes` nothing
/// more is kept and `add` says so, so that the caller resets the stream while nghttp2 is still decoding
/// (an HPACK block that references one table entry thousands of times decodes into megabytes).
///
/// No I/O, no HTTP/2 framing: nghttp2 has checked names, values and pseudo-header rules before a field
/// gets here (lower-case names, no CR/LF/NUL, one `:status`, no connection-specific field, a numeric
/// `content-length`).
public struct HTTP2ResponseFields: Sendable {
    public let maxBytes: Int
    /// `:status`, or -1 when the block had none (trailers) or it was not three digits.
    public private(set) var status = -1
    public private(set) var fields: [(name: [UInt8], value: [UInt8])] = []
    /// The block's size as HTTP/1.1 field lines.
    public private(set) var lineBytes = 0
    private var hasContentLength = false

    public init(maxBytes: Int) {
        self.maxBytes = maxBytes
    }

    /// A new header block starts (the previous one was a 1xx head, the head, or nothing yet).
    public mutating func begin() {
        status = -1
        fields.removeAll(keepingCapacity: true)
        lineBytes = 0
        hasContentLength = false
    }

    /// False once the block is over `maxBytes` (the field is not kept).
    public mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        lineBytes = lineBytes &+ name.count &+ value.count &+ 4
        guard lineBytes <= maxBytes else { return false }
        if name.first == UInt8(ascii: ":") {
            if name.elementsEqual(":status".utf8) { status = Self.threeDigits(value) }
            return true
        }
        if name.elementsEqual("content-length".utf8) { hasContentLength = true }
        fields.append((Array(name), Array(value)))
        return true
    }

    /// A 1xx head: the final one follows on the same stream.
    public var isInterim: Bool { status >= 100 && status < 200 }

    public var stringFields: [(name: String, value: String)] {
        fields.map { (String(decoding: $0.name, as: UTF8.self), String(decoding: $0.value, as: UTF8.self)) }
    }

    /// The HTTP/1.1 head (status line, fields, framing, empty line) of the block as a final response to
    /// `requestMethod`. `endStream`: the HEADERS frame ended the stream (no body follows).
    public func http1Head(requestMethod: HTTPMethod, endStream: Bool, reason: String) -> [UInt8] {
        var bytes = Array("HTTP/1.1 ".utf8)
        bytes.reserveCapacity(lineBytes + reason.utf8.count + 64)
        if status >= 0 {
            bytes.append(contentsOf: String(status).utf8)
        }
        bytes.append(UInt8(ascii: " "))
        bytes.append(contentsOf: reason.utf8)
        bytes.append(contentsOf: "\r\n".utf8)
        for field in fields {
            bytes.append(contentsOf: field.name)
            bytes.append(contentsOf: ": ".utf8)
            bytes.append(contentsOf: field.value)
            bytes.append(contentsOf: "\r\n".utf8)
        }
        let bodiless = requestMethod == .head || status == 204 || status == 304
        if !hasContentLength && !bodiless {
            bytes.append(contentsOf: (endStream ? "content-length: 0\r\n" : "transfer-encoding: chunked\r\n").utf8)
        }
        bytes.append(contentsOf: "\r\n".utf8)
        return bytes
    }

    /// The limits to read `http1Head` with, from an HTTP/1.1 upstream's (`base`): the head's size is not
    /// bounded again (the block was, by `maxBytes`, while it was decoded), and the framing line the mapping
    /// adds is not counted as a field. Otherwise a response with as many fields as an HTTP/1.1 upstream may
    /// send would be refused from an HTTP/2 one (found by the response fuzz target: 256 fields).
    public func headLimits(_ base: HTTPWireLimits, headBytes: Int) -> HTTPWireLimits {
        var limits = base
        limits.maxHeadBytes = max(base.maxHeadBytes, headBytes)
        limits.maxFields = base.maxFields &+ 1
        return limits
    }

    private static func threeDigits(_ value: UnsafeRawBufferPointer) -> Int {
        guard value.count == 3 else { return -1 }
        var number = 0
        for byte in value {
            guard byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") else { return -1 }
            number = number &* 10 &+ Int(byte &- UInt8(ascii: "0"))
        }
        return number
    }
}
