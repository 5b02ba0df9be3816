import HTTPTransport
import HTTPWire

/// A received head's field lines read in place (the transport's `ReceivedFields`: the head's bytes and the
/// offsets HTTPWire found in them). The header rules (`HeaderPolicy`, `ForwardingHeaders`, `RequestHygiene`)
/// run on this on every request and response, so nothing here makes a String or allocates; names are
/// compared ignoring ASCII case. A field let through is written on with `HTTPFieldBlock.appendReceived`,
/// which does not check the parser's work again. Valid only inside the `withFields` call that lent it.
struct FieldTable {
    let received: ReceivedFields

    init(_ received: ReceivedFields) {
        self.received = received
    }

    var bytes: UnsafeRawBufferPointer { received.bytes }
    var fields: [FieldLine] { received.lines }
    /// What the `Connection` fields list, as HTTPWire classified each element while parsing.
    var connection: ConnectionOptions { received.connection }

    var count: Int { fields.count }

    func name(_ index: Int) -> UnsafeRawBufferPointer { received.name(index) }

    func value(_ index: Int) -> UnsafeRawBufferPointer { received.value(index) }

    /// Whether field `index` is named `lowercasedKey`.
    func nameIs(_ index: Int, _ lowercasedKey: StaticString) -> Bool {
        ASCII.equalIgnoringCase(name(index), lowercasedKey)
    }

    /// Whether `name` is listed in a `Connection` field (which makes that field hop-by-hop for this
    /// message, RFC 9110 §7.6.1).
    func isConnectionListed(_ name: UnsafeRawBufferPointer) -> Bool {
        // HTTPWire sorted every listed element into close, keep-alive, upgrade or "another token": unless
        // there was another one, the listed names are known without reading the fields again.
        if !connection.contains(.otherTokens) {
            return (connection.contains(.close) && ASCII.equalIgnoringCase(name, "close"))
                || (connection.contains(.keepAlive) && ASCII.equalIgnoringCase(name, "keep-alive"))
                || (connection.contains(.upgrade) && ASCII.equalIgnoringCase(name, "upgrade"))
        }
        for index in 0..<fields.count where nameIs(index, "connection") {
            var listed = false
            ASCII.forEachListElement(value(index)) { element in
                if !listed && ASCII.equalIgnoringCase(element, name) { listed = true }
            }
            if listed { return true }
        }
        return false
    }
}

extension ReceivedRequestHead {
    /// Calls `body` with the head's field table.
    func withFieldTable<R>(_ body: (FieldTable) -> R) -> R { withFields { body(FieldTable($0)) } }
}

extension ReceivedResponseHead {
    /// Calls `body` with the head's field table (whose `bytes` also hold the reason phrase).
    func withFieldTable<R>(_ body: (FieldTable) -> R) -> R { withFields { body(FieldTable($0)) } }
}

/// Byte-level helpers for field names and values (ASCII by definition: RFC 9110 §5.1, §5.6.2).
enum ASCII {
    /// Calls `body` with a string's UTF-8 bytes in place (copied only if the string is not contiguous).
    static func withBytes<R>(of string: String, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        if let result = string.utf8.withContiguousStorageIfAvailable({ body(UnsafeRawBufferPointer($0)) }) { return result }
        return Array(string.utf8).withUnsafeBytes(body)
    }

    static func lowered(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte }

    static func equalIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ lowercased: StaticString) -> Bool {
        guard bytes.count == lowercased.utf8CodeUnitCount else { return false }
        return lowercased.withUTF8Buffer { wanted in
            for i in 0..<wanted.count where lowered(bytes[i]) != wanted[i] { return false }
            return true
        }
    }

    static func equalIgnoringCase(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count where lowered(a[i]) != lowered(b[i]) { return false }
        return true
    }

    /// `bytes` without leading and trailing spaces and tabs (RFC 9110 §5.6.3).
    static func trimmedOWS(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer {
        var start = 0
        var end = bytes.count
        while start < end && (bytes[start] == 0x20 || bytes[start] == 0x09) { start += 1 }
        while end > start && (bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09) { end -= 1 }
        return UnsafeRawBufferPointer(rebasing: bytes[start..<end])
    }

    /// Each comma-separated element of a list value, trimmed; empty elements included.
    static func forEachListElement(_ value: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) -> Void) {
        var start = 0
        for i in 0...value.count where i == value.count || value[i] == UInt8(ascii: ",") {
            body(trimmedOWS(UnsafeRawBufferPointer(rebasing: value[start..<i])))
            start = i + 1
        }
    }

    /// Digits only, as a non-negative Int; nil for anything else or a value past Int.max.
    static func decimal(_ bytes: UnsafeRawBufferPointer) -> Int? {
        guard !bytes.isEmpty else { return nil }
        var value = 0
        for byte in bytes {
            guard byte >= 0x30 && byte <= 0x39 else { return nil }
            let (times10, o1) = value.multipliedReportingOverflow(by: 10)
            let (sum, o2) = times10.addingReportingOverflow(Int(byte - 0x30))
            guard !o1, !o2 else { return nil }
            value = sum
        }
        return value
    }
}
