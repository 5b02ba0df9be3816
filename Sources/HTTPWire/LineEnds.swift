/// The offsets of the line feeds `HeadParser` met while it searched for the end of a head, in order, so
/// that parsing the head's lines does not search for each one again (the second search was a tenth of a
/// proxied request's parsing). It lives on the stack of one parse call and holds up to `capacity` lines,
/// and only when that call searched the whole head from its start: a head that arrived in pieces was
/// partly searched by earlier calls, whose finds were not kept. Otherwise every line is searched for as
/// before.
///
/// `lineFeed(in:from:to:)` answers exactly what `firstLF` would, for the increasing line starts of one
/// parse: when recording held, the offsets are every LF between the head's start and its end (the search
/// meets each one in order, up to the LF that ends the empty line), so the first recorded offset at or
/// after a line's start is the first LF there.
struct LineEnds {
    static let capacity = 32
    /// 32 offsets of four bytes each, in place (no allocation per head).
    private var offsets: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64,
                          UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64)
        = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    private var count = 0
    /// Every LF met so far is recorded (and so the answers come from the record).
    private var recording = false
    /// The next recorded offset to hand out.
    private var next = 0

    /// The search begins: `fromHeadStart` says whether it covers the head from its first byte.
    mutating func begin(fromHeadStart: Bool) {
        count = 0
        next = 0
        recording = fromHeadStart
    }

    /// An LF the search met (offsets increase from call to call).
    @inline(__always)
    mutating func record(_ offset: Int) {
        guard recording else { return }
        guard count < Self.capacity, offset <= Int(UInt32.max) else {
            recording = false
            return
        }
        let slot = count
        withUnsafeMutableBytes(of: &offsets) { $0.storeBytes(of: UInt32(truncatingIfNeeded: offset), toByteOffset: slot &* 4, as: UInt32.self) }
        count &+= 1
    }

    /// The first LF in `bytes[from..<end]`, or `end` (as `firstLF`); `from` must not decrease between calls.
    @inline(__always)
    mutating func lineFeed(in bytes: UnsafeRawBufferPointer, from: Int, to end: Int) -> Int {
        if recording {
            while next < count {
                let slot = next
                next &+= 1
                let offset = withUnsafeBytes(of: &offsets) { Int($0.load(fromByteOffset: slot &* 4, as: UInt32.self)) }
                if offset >= from { return offset }
            }
        }
        return firstLF(bytes, from: from, to: end)
    }
}
