/// An HTTP/2 request's fields, as they arrive from the HPACK decoder, turned into an HTTP/1.1 request head
/// that `HeadParser` then reads like any other (so every HTTP/1.1 check applies to it too):
/// - `:method` and `:path` make the request line (`:authority` is the target of a CONNECT);
/// - `:authority` becomes `Host`, and a `host` field beside it is left out (RFC 9113 §8.3.1: the two
///   name the same thing, and two `Host` fields would be refused);
/// - `cookie` fields, which HTTP/2 may split, are joined by "; " into one (RFC 9113 §8.2.3);
/// - a body without `content-length` is framed `transfer-encoding: chunked` (HTTP/2 frames it by DATA and
///   END_STREAM, HTTP/1.1 needs to be told);
/// - `:scheme` is not kept: the upstream's scheme is the configuration's.
/// The list is measured as RFC 9113 §6.5.2 measures it (name, value and 32 per field); past `maxBytes`
/// nothing more is kept, and the caller answers 431.
///
/// No I/O, no HTTP/2 framing: the decoder (nghttp2) has checked names, values and pseudo-header rules
/// before a field gets here.
public struct HTTP2RequestFields: Sendable {
    public private(set) var method: [UInt8] = []
    public private(set) var path: [UInt8] = []
    public private(set) var authority: [UInt8] = []
    private var fieldLines: [UInt8] = []
    private var cookie: [UInt8] = []
    private var hasContentLength = false
    public private(set) var listSize = 0
    public let maxBytes: Int

    public init(maxBytes: Int) {
        self.maxBytes = maxBytes
    }

    public var isOverLimit: Bool { listSize > maxBytes }

    public mutating func add(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        listSize += name.count + value.count + 32
        guard listSize <= maxBytes else { return }
        if name.first == UInt8(ascii: ":") {
            if Self.equal(name, ":method") { method = Array(value) }
            else if Self.equal(name, ":path") { path = Array(value) }
            else if Self.equal(name, ":authority") { authority = Array(value) }
            return
        }
        if Self.equal(name, "cookie") {
            if !cookie.isEmpty { cookie.append(contentsOf: "; ".utf8) }
            cookie.append(contentsOf: value)
            return
        }
        if Self.equal(name, "host") && !authority.isEmpty { return }
        if Self.equal(name, "content-length") { hasContentLength = true }
        fieldLines.append(contentsOf: name)
        fieldLines.append(contentsOf: ": ".utf8)
        fieldLines.append(contentsOf: value)
        fieldLines.append(contentsOf: "\r\n".utf8)
    }

    /// The HTTP/1.1 head (request line, fields, empty line). `endStream`: the HEADERS frame ended the
    /// stream, so there is no body.
    public func http1Head(endStream: Bool) -> [UInt8] {
        var bytes = method
        bytes.reserveCapacity(method.count + path.count + authority.count + fieldLines.count + cookie.count + 64)
        bytes.append(UInt8(ascii: " "))
        bytes.append(contentsOf: path.isEmpty ? authority : path)
        bytes.append(contentsOf: " HTTP/1.1\r\n".utf8)
        if !authority.isEmpty {
            bytes.append(contentsOf: "host: ".utf8)
            bytes.append(contentsOf: authority)
            bytes.append(contentsOf: "\r\n".utf8)
        }
        bytes.append(contentsOf: fieldLines)
        if !cookie.isEmpty {
            bytes.append(contentsOf: "cookie: ".utf8)
            bytes.append(contentsOf: cookie)
            bytes.append(contentsOf: "\r\n".utf8)
        }
        if !endStream && !hasContentLength { bytes.append(contentsOf: "transfer-encoding: chunked\r\n".utf8) }
        bytes.append(contentsOf: "\r\n".utf8)
        return bytes
    }

    /// `name` is exactly `lowercase` (HTTP/2 names are lower-case; nghttp2 refuses others).
    private static func equal(_ name: UnsafeRawBufferPointer, _ lowercase: StaticString) -> Bool {
        guard name.count == lowercase.utf8CodeUnitCount else { return false }
        let other = UnsafeRawBufferPointer(start: lowercase.utf8Start, count: lowercase.utf8CodeUnitCount)
        return name.elementsEqual(other)
    }
}
