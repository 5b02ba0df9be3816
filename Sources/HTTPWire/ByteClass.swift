// Byte classes of RFC 9110/9112, as switch statements (no table, so nothing global to initialise).

@usableFromInline let CR: UInt8 = 0x0D
@usableFromInline let LF: UInt8 = 0x0A
@usableFromInline let SP: UInt8 = 0x20
@usableFromInline let HTAB: UInt8 = 0x09

/// tchar (RFC 9110 section 5.6.2): ALPHA, DIGIT and ! # $ % & ' * + - . ^ _ ` | ~, as two 64-bit sets (bytes
/// 0x00-0x3F and 0x40-0x7F; nothing above). `isTokenByteBySwitch` spells the same set out.
@inlinable @inline(__always)
func isTokenByte(_ b: UInt8) -> Bool {
    let set: UInt64 = b < 0x40 ? 0x03FF_6CFA_0000_0000 : 0x57FF_FFFF_C7FF_FFFE
    return b < 0x80 && (set &>> UInt64(b & 0x3F)) & 1 != 0
}

func isTokenByteBySwitch(_ b: UInt8) -> Bool {
    switch b {
    case 0x61...0x7A, 0x41...0x5A, 0x30...0x39: return true
    // ! # $ % & ' * + - . ^ _ ` | ~
    case 0x21, 0x23, 0x24, 0x25, 0x26, 0x27, 0x2A, 0x2B, 0x2D, 0x2E, 0x5E, 0x5F, 0x60, 0x7C, 0x7E: return true
    default: return false
    }
}

/// field-vchar / SP / HTAB; everything else (NUL, other controls, DEL) is refused, never stripped.
@inlinable @inline(__always)
func isFieldValueByte(_ b: UInt8) -> Bool {
    b == HTAB || (b >= 0x20 && b != 0x7F)
}

/// Bytes of a request target: visible ASCII and bytes >= 0x80 (forwarded unchanged); SP, controls and
/// DEL are refused, because a target is copied into the upstream's request line byte for byte.
@inlinable @inline(__always)
func isTargetByte(_ b: UInt8) -> Bool {
    b > 0x20 && b != 0x7F
}

@inlinable @inline(__always)
func isWhitespace(_ b: UInt8) -> Bool { b == SP || b == HTAB }

@inlinable @inline(__always)
func isAlpha(_ b: UInt8) -> Bool { (b | 0x20) &- 0x61 < 26 }

@inlinable @inline(__always)
func isDigit(_ b: UInt8) -> Bool { b &- 0x30 < 10 }

/// Value of a hexadecimal digit, or nil.
@inlinable @inline(__always)
func hexValue(_ b: UInt8) -> Int? {
    switch b {
    case 0x30...0x39: return Int(b &- 0x30)
    case 0x61...0x66: return Int(b &- 0x61 &+ 10)
    case 0x41...0x46: return Int(b &- 0x41 &+ 10)
    default: return nil
    }
}

@inlinable @inline(__always)
func asciiLower(_ b: UInt8) -> UInt8 { (b >= 0x41 && b <= 0x5A) ? b | 0x20 : b }

/// `bytes[range]` equals `lowercaseLiteral` ignoring ASCII case.
@inlinable
func equalsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, _ lowercaseLiteral: StaticString) -> Bool {
    guard lowercaseLiteral.utf8CodeUnitCount == range.count else { return false }
    let p = lowercaseLiteral.utf8Start
    var i = 0
    while i < range.count {
        if asciiLower(bytes[range.lowerBound &+ i]) != p[i] { return false }
        i &+= 1
    }
    return true
}

/// `range` without leading and trailing SP/HTAB.
@inlinable
func trimmed(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Range<Int> {
    var lo = range.lowerBound, hi = range.upperBound
    while lo < hi && isWhitespace(bytes[lo]) { lo &+= 1 }
    while hi > lo && isWhitespace(bytes[hi &- 1]) { hi &-= 1 }
    return lo..<hi
}

// Eight bytes at a time: heads are scanned several times (the end of the head, each line's end, each
// value's bytes), and a byte-at-a-time loop costs about ten instructions a byte. The words are read
// unaligned and in little-endian order, so the lowest flagged byte is the first one in the buffer.

@usableFromInline let lowBits: UInt64 = 0x0101_0101_0101_0101
@usableFromInline let highBits: UInt64 = 0x8080_8080_8080_8080

/// The high bit of each byte of `word` that is zero (exact for the lowest such byte; a byte above a zero
/// byte may be flagged too, which only ever matters after the first).
@inlinable @inline(__always)
func zeroBytes(_ word: UInt64) -> UInt64 { (word &- lowBits) & ~word & highBits }

/// Index of the first LF in `bytes[from..<end]`, or `end`.
@inlinable
func firstLF(_ bytes: UnsafeRawBufferPointer, from: Int, to end: Int) -> Int {
    var i = from
    while i &+ 8 <= end {
        let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self))
        let found = zeroBytes(word ^ (lowBits &* UInt64(LF)))
        if found != 0 { return i &+ found.trailingZeroBitCount &>> 3 }
        i &+= 8
    }
    while i < end && bytes[i] != LF { i &+= 1 }
    return i
}

/// Whether every byte of `bytes[range]` is a field-value byte (`isFieldValueByte`).
@inlinable
func allFieldValueBytes(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool {
    var i = range.lowerBound
    let end = range.upperBound
    while i &+ 8 <= end {
        let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self))
        // A byte below 0x20 (a tab among them, checked one by one below) or a DEL.
        let belowSpace = (word &- lowBits &* 0x20) & ~word & highBits
        let delete = zeroBytes(word ^ (lowBits &* 0x7F))
        if belowSpace | delete != 0 {
            for j in i..<(i &+ 8) where !isFieldValueByte(bytes[j]) { return false }
        }
        i &+= 8
    }
    while i < end {
        if !isFieldValueByte(bytes[i]) { return false }
        i &+= 1
    }
    return true
}
