// Byte classes of RFC 9110/9112, as switch statements (no table, so nothing global to initialise).

@usableFromInline let CR: UInt8 = 0x0D
@usableFromInline let LF: UInt8 = 0x0A
@usableFromInline let SP: UInt8 = 0x20
@usableFromInline let HTAB: UInt8 = 0x09

@inlinable @inline(__always)
func isTokenByte(_ b: UInt8) -> Bool {
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
