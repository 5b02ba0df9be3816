/// The field lines of a head being written, serialised as they are added ("Name: value\r\n") into the
/// connection's own buffer, which keeps its capacity from one head to the next: a head costs no
/// allocation per field, nor per message once the buffer has grown.
///
/// Every field is checked as it goes in, as `isSendableField` checks: a name that is not a token, a value
/// with a control character (which could end the head early), or one of the framing fields the transport
/// writes itself (Content-Length, Transfer-Encoding, Connection) is left out. A block is lent to the
/// caller of `startRequest(... fields:)`, `startResponse(... fields:)` and their kin for the duration of
/// the call.
public struct HTTPFieldBlock {
    var bytes: [UInt8]
    /// Leave out `Expect` fields: the transport writes its own `Expect: 100-continue`.
    var dropsExpect = false
    /// Start of the field being written in pieces (`startField`), or -1.
    private var openField = -1
    private var openFieldRefused = false

    /// A block of its own (to see what a rule writes); connections lend theirs.
    public init() {
        bytes = []
    }

    /// The field lines written so far, each ending in CR LF.
    public var serialized: [UInt8] { bytes }

    init(reusing buffer: inout [UInt8]) {
        bytes = []
        swap(&bytes, &buffer)
    }

    /// Gives the buffer back to its connection.
    mutating func returnBuffer(to buffer: inout [UInt8]) {
        swap(&bytes, &buffer)
    }

    /// Adds a field; nothing is written if it is not sendable.
    public mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard openField < 0, acceptsName(name), hasNoControls(value) else { return }
        bytes.append(contentsOf: name)
        appendLiteral(": ")
        bytes.append(contentsOf: value)
        appendLiteral("\r\n")
    }

    public mutating func append(name: String, value: String) {
        withBytes(of: name) { name in withBytes(of: value) { value in append(name: name, value: value) } }
    }

    /// Starts a field whose value is written in pieces (`appendToValue`), ended by `endField()`; for a
    /// list folded from several received fields. The field is left out if its name or any piece is not
    /// sendable.
    public mutating func startField(name: String) {
        guard openField < 0 else { return }
        openField = bytes.count
        openFieldRefused = withBytes(of: name) { name in
            guard acceptsName(name) else { return true }
            bytes.append(contentsOf: name)
            return false
        }
        appendLiteral(": ")
    }

    public mutating func appendToValue(_ piece: UnsafeRawBufferPointer) {
        guard openField >= 0, !openFieldRefused else { return }
        guard hasNoControls(piece) else {
            openFieldRefused = true
            return
        }
        bytes.append(contentsOf: piece)
    }

    public mutating func appendToValue(_ piece: String) {
        withBytes(of: piece) { appendToValue($0) }
    }

    public mutating func endField() {
        guard openField >= 0 else { return }
        if openFieldRefused {
            bytes.removeSubrange(openField...)
        } else {
            appendLiteral("\r\n")
        }
        openField = -1
        openFieldRefused = false
    }

    private func acceptsName(_ name: UnsafeRawBufferPointer) -> Bool {
        guard isSendableFieldName(name) else { return false }
        return !(dropsExpect && asciiEqualIgnoringCase(name, "expect"))
    }

    mutating func appendLiteral(_ literal: StaticString) {
        literal.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }
}

/// Calls `body` with a string's UTF-8 bytes in place (a copy only for a string not stored contiguously).
func withBytes<R>(of string: String, _ body: (UnsafeRawBufferPointer) -> R) -> R {
    if let result = string.utf8.withContiguousStorageIfAvailable({ body(UnsafeRawBufferPointer($0)) }) { return result }
    return Array(string.utf8).withUnsafeBytes(body)
}

/// A connection's head buffer keeps up to this much capacity between heads (more is an unusual head,
/// not worth holding on an idle keep-alive connection).
let maxKeptHeadCapacity = 4096
