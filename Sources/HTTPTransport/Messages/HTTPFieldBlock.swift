import Glibc

/// The field lines of a head being written, serialised as they are added ("Name: value\r\n") into the
/// connection's own head buffer, which keeps its memory from one head to the next: a head costs no
/// allocation per field, nor per message once the buffer has grown.
///
/// Every field is checked as it goes in, as `isSendableField` checks: a name that is not a token, a value
/// with a control character (which could end the head early), or one of the framing fields the transport
/// writes itself (Content-Length, Transfer-Encoding, Connection) is left out. A field of a received head
/// (`appendReceived`) passed the parser's checks of the same bytes when it arrived, so only its name is
/// compared with the transport's own fields; everything else (a token from the token endpoint, a name or
/// value from the configuration) is read whole. A block is lent to the caller of `startRequest(... fields:)`,
/// `startResponse(... fields:)` and their kin for the duration of the call.
public struct HTTPFieldBlock {
    let buffer: HeadBuffer
    /// Leave out `Expect` fields: the transport writes its own `Expect: 100-continue`.
    var dropsExpect = false
    /// Start of the field being written in pieces (`startField`), or -1.
    private var openField = -1
    private var openFieldRefused = false
    /// A field is being written in pieces: nothing else goes in until `endField()`.
    var isWritingField: Bool { openField >= 0 }

    /// A block of its own (to see what a rule writes); connections lend theirs.
    public init() {
        buffer = HeadBuffer()
    }

    init(writingInto buffer: HeadBuffer) {
        self.buffer = buffer
    }

    /// The field lines written so far, each ending in CR LF.
    public var serialized: [UInt8] { Array(buffer.bytes) }

    /// Adds a field; nothing is written if it is not sendable.
    public mutating func append(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard openField < 0, acceptsName(name), hasNoControls(value) else { return }
        buffer.appendField(name, value)
    }

    /// Adds field `index` of a received head as it came. Its name and value are not read again (see
    /// `ReceivedFields`); it is left out only if it is one of the transport's own fields.
    public mutating func appendReceived(_ index: Int, of fields: ReceivedFields) {
        let name = fields.name(index)
        guard openField < 0, !isTransportsOwn(name) else { return }
        buffer.appendField(name, fields.value(index))
    }

    public mutating func append(name: String, value: String) {
        var name = name, value = value
        name.withUTF8 { name in value.withUTF8 { value in append(name: UnsafeRawBufferPointer(name), value: UnsafeRawBufferPointer(value)) } }
    }

    public mutating func append(name: StaticString, value: String) {
        var value = value
        name.withUTF8Buffer { name in value.withUTF8 { value in append(name: UnsafeRawBufferPointer(name), value: UnsafeRawBufferPointer(value)) } }
    }

    public mutating func append(name: StaticString, value: StaticString) {
        name.withUTF8Buffer { name in value.withUTF8Buffer { value in append(name: UnsafeRawBufferPointer(name), value: UnsafeRawBufferPointer(value)) } }
    }

    /// Starts a field whose value is written in pieces (`appendToValue`), ended by `endField()`; for a
    /// list folded from several received fields. The field is left out if its name or any piece is not
    /// sendable.
    public mutating func startField(name: StaticString) {
        guard openField < 0 else { return }
        openField = buffer.count
        openFieldRefused = name.withUTF8Buffer { name in
            let name = UnsafeRawBufferPointer(name)
            guard acceptsName(name) else { return true }
            buffer.append(name)
            return false
        }
        buffer.append(literal: ": ")
    }

    public mutating func appendToValue(_ piece: UnsafeRawBufferPointer) {
        guard openField >= 0, !openFieldRefused else { return }
        guard hasNoControls(piece) else {
            openFieldRefused = true
            return
        }
        buffer.append(piece)
    }

    /// Adds the value of field `index` of a received head to the open field, as it came (see `ReceivedFields`).
    public mutating func appendReceivedValue(_ index: Int, of fields: ReceivedFields) {
        guard openField >= 0, !openFieldRefused else { return }
        buffer.append(fields.value(index))
    }

    public mutating func appendToValue(_ piece: String) {
        var piece = piece
        piece.withUTF8 { appendToValue(UnsafeRawBufferPointer($0)) }
    }

    public mutating func appendToValue(_ piece: StaticString) {
        piece.withUTF8Buffer { appendToValue(UnsafeRawBufferPointer($0)) }
    }

    public mutating func endField() {
        guard openField >= 0 else { return }
        if openFieldRefused {
            buffer.truncate(to: openField)
        } else {
            buffer.append(literal: "\r\n")
        }
        openField = -1
        openFieldRefused = false
    }

    private func acceptsName(_ name: UnsafeRawBufferPointer) -> Bool {
        isToken(name) && !isTransportsOwn(name)
    }

    /// A framing field, or Expect when the transport writes its own (`isSendableFieldName` without the
    /// token check). Told apart by length first: most names are compared with nothing.
    @inline(__always)
    private func isTransportsOwn(_ name: UnsafeRawBufferPointer) -> Bool {
        switch name.count {
        case 6: return dropsExpect && asciiEqualIgnoringCase(name, "expect")
        case 10: return asciiEqualIgnoringCase(name, "connection")
        case 14: return asciiEqualIgnoringCase(name, "content-length")
        case 17: return asciiEqualIgnoringCase(name, "transfer-encoding")
        default: return false
        }
    }
}

/// The bytes of a head being written: a connection's own, kept between heads (up to
/// `maxKeptHeadCapacity`), written with plain copies.
final class HeadBuffer {
    private var base: UnsafeMutableRawPointer?
    private var capacity = 0
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// Valid until the next change.
    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }

    /// Inlined (as `reserve`): a head is written in a few dozen pieces, most of them literals whose length
    /// the compiler then knows, and a call per piece cost more than its copy.
    @inline(__always)
    func append(_ piece: UnsafeRawBufferPointer) {
        guard let source = piece.baseAddress, piece.count > 0 else { return }
        copyPiece(to: reserve(piece.count), from: source, count: piece.count)
    }

    @inline(__always)
    func append(_ byte: UInt8) {
        reserve(1).storeBytes(of: byte, as: UInt8.self)
    }

    @inline(__always)
    func append(literal: StaticString) {
        literal.withUTF8Buffer { append(UnsafeRawBufferPointer($0)) }
    }

    /// A decimal number without a String. Numbers under 10^8 (every status code, nearly every length) are
    /// built in one word, most significant digit in its lowest byte, and stored at once.
    func appendDecimal(_ value: Int) {
        if value < 0 { append(UInt8(ascii: "-")) }
        var n = value.magnitude
        guard n < 100_000_000 else { return appendLongDecimal(n) }
        var word: UInt64 = 0
        var digits = 0
        repeat {
            word = word &<< 8 | UInt64(truncatingIfNeeded: 0x30 &+ n % 10)
            n /= 10
            digits &+= 1
        } while n > 0
        let start = reserve(8)
        start.storeBytes(of: word.littleEndian, as: UInt64.self)
        count -= 8 - digits   // only the digits count as written
    }

    private func appendLongDecimal(_ value: UInt) {
        var n = value
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)
        withUnsafeMutableBytes(of: &digits) { buffer in
            var i = buffer.count
            repeat {
                i -= 1
                buffer[i] = UInt8(truncatingIfNeeded: 0x30 &+ n % 10)
                n /= 10
            } while n > 0
            append(UnsafeRawBufferPointer(rebasing: buffer[i...]))
        }
    }

    /// "name: value\r\n" with one capacity check.
    func appendField(_ name: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        let start = reserve(name.count + value.count + 4)
        if let source = name.baseAddress { copyPiece(to: start, from: source, count: name.count) }
        var at = start + name.count
        at.storeBytes(of: 0x3A, as: UInt8.self)
        (at + 1).storeBytes(of: 0x20, as: UInt8.self)
        at += 2
        if let source = value.baseAddress { copyPiece(to: at, from: source, count: value.count) }
        at += value.count
        at.storeBytes(of: 0x0D, as: UInt8.self)
        (at + 1).storeBytes(of: 0x0A, as: UInt8.self)
    }

    func truncate(to newCount: Int) {
        if newCount < count { count = max(0, newCount) }
    }

    /// Empties the buffer, keeping an ordinary head's memory for the next head.
    func clear() {
        count = 0
        if capacity > maxKeptHeadCapacity {
            free(base)
            base = nil
            capacity = 0
        }
    }

    /// Room for `n` more bytes, counted as written: returns where they go. Inlined into every append (a
    /// head is written in a few dozen pieces); only growing is a call.
    @inline(__always)
    private func reserve(_ n: Int) -> UnsafeMutableRawPointer {
        let needed = count + n
        if needed > capacity { grow(to: needed) }
        let start = base! + count
        count = needed
        return start
    }

    @inline(never)
    private func grow(to needed: Int) {
        let grown = max(needed, max(512, capacity * 2))
        guard let moved = realloc(base, grown) else { fatalError("out of memory for a message head") }
        base = moved
        capacity = grown
    }

    deinit { free(base) }
}

/// Copies a piece of a head (a literal, a name, a value, a prepared field's line; never overlapping the
/// destination). Heads are written in a few dozen small pieces, and for those a call to memcpy costs more
/// than the copy: up to 32 bytes are moved as overlapping words (the first and last 16, or 8), or byte by
/// byte below 8.
@inline(__always)
func copyPiece(to destination: UnsafeMutableRawPointer, from source: UnsafeRawPointer, count: Int) {
    if count > 32 {
        destination.copyMemory(from: source, byteCount: count)
    } else if count > 16 {
        let first = (source.loadUnaligned(as: UInt64.self), source.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        let last = (source.loadUnaligned(fromByteOffset: count - 16, as: UInt64.self),
                    source.loadUnaligned(fromByteOffset: count - 8, as: UInt64.self))
        destination.storeBytes(of: first.0, as: UInt64.self)
        destination.storeBytes(of: first.1, toByteOffset: 8, as: UInt64.self)
        destination.storeBytes(of: last.0, toByteOffset: count - 16, as: UInt64.self)
        destination.storeBytes(of: last.1, toByteOffset: count - 8, as: UInt64.self)
    } else if count >= 8 {
        let first = source.loadUnaligned(as: UInt64.self)
        let last = source.loadUnaligned(fromByteOffset: count - 8, as: UInt64.self)
        destination.storeBytes(of: first, as: UInt64.self)
        destination.storeBytes(of: last, toByteOffset: count - 8, as: UInt64.self)
    } else {
        for i in 0..<count {
            destination.storeBytes(of: source.load(fromByteOffset: i, as: UInt8.self), toByteOffset: i, as: UInt8.self)
        }
    }
}

/// A connection's head buffer keeps up to this much memory between heads (more is an unusual head,
/// not worth holding on an idle keep-alive connection).
let maxKeptHeadCapacity = 4096
