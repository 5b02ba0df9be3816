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

/// SP, HTAB and , / @ ? # \ are refused in a Host value (no whitespace, no list, no path or userinfo), as
/// two 64-bit sets like `isTokenByte` (`isRefusedInHostBySwitch` spells them out).
@inlinable @inline(__always)
func isRefusedInHost(_ b: UInt8) -> Bool {
    let set: UInt64 = b < 0x40 ? 0x8000_9009_0000_0200 : 0x0000_0000_1000_0001
    return b < 0x80 && (set &>> UInt64(b & 0x3F)) & 1 != 0
}

func isRefusedInHostBySwitch(_ b: UInt8) -> Bool {
    switch b {
    case SP, HTAB, UInt8(ascii: ","), UInt8(ascii: "/"), UInt8(ascii: "@"), UInt8(ascii: "?"), UInt8(ascii: "#"), UInt8(ascii: "\\"): return true
    default: return false
    }
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

/// `bytes[range]` equals `lowercaseLiteral` (lower-case ASCII) ignoring ASCII case. Eight bytes at a time
/// from eight bytes on, the last word overlapping the one before (field names are compared with this
/// several times per head).
@inlinable
func equalsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, _ lowercaseLiteral: StaticString) -> Bool {
    let n = lowercaseLiteral.utf8CodeUnitCount
    guard n == range.count else { return false }
    let p = lowercaseLiteral.utf8Start
    if n >= 8 {
        let literal = UnsafeRawPointer(p)
        var at = 0
        while true {
            let received = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: range.lowerBound &+ at, as: UInt64.self))
            let wanted = UInt64(littleEndian: literal.loadUnaligned(fromByteOffset: at, as: UInt64.self))
            guard wordEqualsIgnoringCase(received, lowercase: wanted) else { return false }
            if at &+ 8 >= n { return true }
            at = min(at &+ 8, n &- 8)
        }
    }
    var i = 0
    while i < n {
        if asciiLower(bytes[range.lowerBound &+ i]) != p[i] { return false }
        i &+= 1
    }
    return true
}

/// Whether the eight received bytes equal the eight bytes of a lower-case ASCII literal, ASCII case
/// ignored: where the literal has a letter (0x61...0x7A) the received byte is compared with bit 0x20 set
/// (which makes only its upper-case twin equal too), everywhere else exactly. The additions act on the
/// literal only, whose bytes are all below 0x80, so none carries into the next byte.
@inlinable @inline(__always)
func wordEqualsIgnoringCase(_ received: UInt64, lowercase literal: UInt64) -> Bool {
    let letters = (literal &+ lowBits &* 0x1F) & ~(literal &+ lowBits &* 0x05) & highBits   // >= 0x61, not >= 0x7B
    return received | (letters &>> 2) == literal                                             // 0x80 >> 2 = 0x20
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
    firstIndex(of: LF, in: bytes, from: from, to: end)
}

/// Index of the first `target` byte in `bytes[from..<end]`, or `end`.
@inlinable @inline(__always)
func firstIndex(of target: UInt8, in bytes: UnsafeRawBufferPointer, from: Int, to end: Int) -> Int {
    var i = from
    while i &+ 8 <= end {
        let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self))
        let found = zeroBytes(word ^ (lowBits &* UInt64(target)))
        if found != 0 { return i &+ found.trailingZeroBitCount &>> 3 }
        i &+= 8
    }
    while i < end && bytes[i] != target { i &+= 1 }
    return i
}

/// Whether an 8-byte word holds only ASCII letters, digits and "-", the bytes nearly every field name is
/// made of (all of them tchar, none of them "_"). Each test below sets a byte's high bit; with every byte
/// below 0x80 (checked first) no addition carries into the next byte, so each byte is judged alone.
@inlinable @inline(__always)
func isCommonNameWord(_ word: UInt64) -> Bool {
    guard word & highBits == 0 else { return false }
    let folded = word | (lowBits &* 0x20)   // A-Z to a-z; digits and "-" unchanged
    let letter = (folded &+ lowBits &* 0x1F) & ~(folded &+ lowBits &* 0x05)   // >= 0x61 and not >= 0x7B
    let digit = (word &+ lowBits &* 0x50) & ~(word &+ lowBits &* 0x46)        // >= 0x30 and not >= 0x3A
    let fromDash = word ^ (lowBits &* 0x2D)
    let dash = ~((fromDash &+ lowBits &* 0x7F) | fromDash)                    // the byte was exactly "-"
    return (letter | digit | dash) & highBits == highBits
}

/// Skips whole 8-byte words of `bytes[from..<end]` made only of letters, digits and "-" (see
/// `isCommonNameWord`): where a field-name scan continues byte by byte. Every byte skipped is a tchar
/// and none is "_".
@inlinable @inline(__always)
func skipCommonNameWords(_ bytes: UnsafeRawBufferPointer, from: Int, to end: Int) -> Int {
    var i = from
    while i &+ 8 <= end {
        let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self))
        guard isCommonNameWord(word) else { break }
        i &+= 8
    }
    return i
}

/// Whether `bytes[range]` is made only of letters, digits and "-", judged a word at a time. True: every
/// byte is a tchar and none is "_". False: only that the words did not show it (the caller judges byte by
/// byte then). A range of eight bytes or more ends with the word that ends it (overlapping bytes already
/// judged); one of four to seven bytes is read as two overlapping halves of a word; a shorter one as the
/// word that starts it, the bytes past the range masked out, if the buffer holds eight bytes from there
/// (`readableEnd`).
@inlinable @inline(__always)
func isCommonName(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>, readableEnd: Int) -> Bool {
    let n = range.count
    if n >= 8 {
        let i = skipCommonNameWords(bytes, from: range.lowerBound, to: range.upperBound)
        if i == range.upperBound { return true }
        if i &+ 8 <= range.upperBound { return false }   // a whole word failed
        let last = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: range.upperBound &- 8, as: UInt64.self))
        return isCommonNameWord(last)
    }
    if n >= 4 {
        // Four to seven bytes: two overlapping four-byte reads inside the range make one word.
        let first = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: range.lowerBound, as: UInt32.self))
        let last = UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: range.upperBound &- 4, as: UInt32.self))
        return isCommonNameWord(UInt64(first) | UInt64(last) &<< 32)
    }
    guard n > 0, range.lowerBound &+ 8 <= readableEnd else { return false }
    let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: range.lowerBound, as: UInt64.self))
    let kept = (UInt64(1) &<< UInt64(n &* 8)) &- 1   // the range's bytes are the low ones (little-endian)
    return isCommonNameWord((word & kept) | (lowBits &* 0x61 & ~kept))
}

/// Whether `bytes` is a token (RFC 9110 section 5.6.2), as a field name must be: for code that writes
/// heads and checks every name it sends.
@inlinable
public func isToken(_ bytes: UnsafeRawBufferPointer) -> Bool {
    guard !bytes.isEmpty else { return false }
    if isCommonName(bytes, 0..<bytes.count, readableEnd: bytes.count) { return true }
    var i = 0
    while i < bytes.count {
        guard isTokenByte(bytes[i]) else { return false }
        i &+= 1
    }
    return true
}

/// Whether every byte of `bytes` may stand in a field value (`isFieldValueByte`: no control but HTAB, no
/// DEL), so that a value written into a head can never end a line or the head early.
@inlinable
public func isFieldValue(_ bytes: UnsafeRawBufferPointer) -> Bool {
    allFieldValueBytes(bytes, 0..<bytes.count)
}

/// Whether every byte of `bytes[range]` is a field-value byte (`isFieldValueByte`).
@inlinable
func allFieldValueBytes(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool {
    var i = range.lowerBound
    let end = range.upperBound
    guard end &- i >= 8 else {
        while i < end {
            if !isFieldValueByte(bytes[i]) { return false }
            i &+= 1
        }
        return true
    }
    // Word by word; the last word is the one that ends the range (overlapping bytes already judged), so
    // no byte is left for a byte loop.
    while true {
        if !allFieldValueBytes(inWordAt: i, of: bytes) { return false }
        if i &+ 8 >= end { return true }
        i = min(i &+ 8, end &- 8)
    }
}

/// Whether the eight bytes from `offset` are all field-value bytes.
@inlinable @inline(__always)
func allFieldValueBytes(inWordAt offset: Int, of bytes: UnsafeRawBufferPointer) -> Bool {
    let word = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
    // A byte below 0x20 (a tab among them, checked one by one below) or a DEL.
    let belowSpace = (word &- lowBits &* 0x20) & ~word & highBits
    let delete = zeroBytes(word ^ (lowBits &* 0x7F))
    if belowSpace | delete == 0 { return true }
    for j in offset..<(offset &+ 8) where !isFieldValueByte(bytes[j]) { return false }
    return true
}
