import CNghttp2

/// The fields of one HTTP/2 HEADERS frame we send, gathered into one buffer (names lower-cased) for
/// nghttp2, which copies them when the frame is submitted. Fields HTTP/2 forbids are left out (RFC 9113
/// §8.2.2: connection-specific ones; tokenrelay's own header rules drop them before, this is the
/// transport's guarantee), as are any the caller's lines name twice as pseudo-headers.
struct HTTP2FieldList {
    /// Starts with one byte, so that its base address exists even with no field.
    private var bytes: [UInt8] = [0]
    /// Offsets into `bytes`: name start, name length, value start, value length.
    private var fields: [(Int, Int, Int, Int)] = []

    init() {}

    init(status: Int) {
        append(name: ":status", decimal: status)
    }

    mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        let nameStart = bytes.count
        for byte in name { bytes.append(byte >= 65 && byte <= 90 ? byte + 32 : byte) }
        let valueStart = bytes.count
        bytes.append(contentsOf: value)
        fields.append((nameStart, name.count, valueStart, value.count))
    }

    mutating func append(name: String, value: String) {
        var name = name, value = value
        name.withUTF8 { name in value.withUTF8 { value in append(name: UnsafeRawBufferPointer(name), value: UnsafeRawBufferPointer(value)) } }
    }

    mutating func append(name: StaticString, decimal: Int) {
        var digits = String(decimal)
        name.withUTF8Buffer { name in digits.withUTF8 { append(name: UnsafeRawBufferPointer(name), value: UnsafeRawBufferPointer($0)) } }
    }

    /// "Name: value\r\n" lines (an `HTTPFieldBlock`'s), connection-specific ones left out.
    mutating func appendLines(_ lines: UnsafeRawBufferPointer) {
        Self.forEachLine(lines) { name, value in
            if !Self.isConnectionSpecific(name) { append(name: name, value: value) }
        }
    }

    /// A request's "Name: value\r\n" lines: as `appendLines`, but a `Host` line sets `authority` instead
    /// (RFC 9113 §8.3.1: `:authority` carries it), and `te: trailers`, the one `te` HTTP/2 allows (gRPC
    /// needs it), is kept.
    mutating func appendLines(_ lines: UnsafeRawBufferPointer, authority: inout String) {
        Self.forEachLine(lines) { name, value in
            if name.count == 4 && asciiEqualIgnoringCase(name, "host") {
                authority = String(decoding: value, as: UTF8.self)
            } else if name.count == 2 && asciiEqualIgnoringCase(name, "te") {
                if asciiEqualIgnoringCase(value, "trailers") { append(name: name, value: value) }
            } else if !Self.isConnectionSpecific(name) {
                append(name: name, value: value)
            }
        }
    }

    /// Each "Name: value" of CRLF-ended lines our own `HTTPFieldBlock` wrote (so well formed): the name,
    /// and the value without the white space after the colon.
    private static func forEachLine(_ lines: UnsafeRawBufferPointer,
                                    _ body: (_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) -> Void) {
        var start = 0
        while start < lines.count {
            var end = start
            while end < lines.count && lines[end] != UInt8(ascii: "\r") { end += 1 }
            var colon = start
            while colon < end && lines[colon] != UInt8(ascii: ":") { colon += 1 }
            if colon < end {
                var valueStart = colon + 1
                while valueStart < end && (lines[valueStart] == 32 || lines[valueStart] == 9) { valueStart += 1 }
                body(UnsafeRawBufferPointer(rebasing: lines[start..<colon]), UnsafeRawBufferPointer(rebasing: lines[valueStart..<end]))
            }
            start = end + 2
        }
    }

    mutating func append(contentsOf other: HTTP2FieldList) {
        let shift = bytes.count - 1
        bytes.append(contentsOf: other.bytes.dropFirst())
        for field in other.fields { fields.append((field.0 + shift, field.1, field.2 + shift, field.3)) }
    }

    static func isConnectionSpecific(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 2: return asciiEqualIgnoringCase(name, "te")
        case 7: return asciiEqualIgnoringCase(name, "upgrade")
        case 10: return asciiEqualIgnoringCase(name, "connection") || asciiEqualIgnoringCase(name, "keep-alive")
        case 16: return asciiEqualIgnoringCase(name, "proxy-connection")
        case 17: return asciiEqualIgnoringCase(name, "transfer-encoding")
        default: return false
        }
    }

    /// The fields as nghttp2's name/value array, valid during `body`.
    func withNameValues(_ body: (UnsafePointer<nghttp2_nv>, Int) -> Void) {
        bytes.withUnsafeBufferPointer { storage in
            // nghttp2 only reads the fields (its type is mutable for historical reasons).
            let base = UnsafeMutablePointer(mutating: storage.baseAddress!)
            withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(1, fields.count)) { nva in
                for (index, field) in fields.enumerated() {
                    nva[index] = nghttp2_nv(name: base + field.0, value: base + field.2, namelen: field.1, valuelen: field.3,
                                            flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
                }
                body(UnsafePointer(nva.baseAddress!), fields.count)
            }
        }
    }
}
