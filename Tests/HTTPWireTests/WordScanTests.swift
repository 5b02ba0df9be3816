@testable import HTTPWire
import XCTest

/// The eight-bytes-at-a-time scans agree with the byte-at-a-time rules they replace, at every offset and
/// length, around every byte value.
final class WordScanTests: XCTestCase {
    func testFirstLFMatchesAByteLoop() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let length = Int.random(in: 0...40, using: &generator)
            let bytes = (0..<length).map { _ in [UInt8(0x0A), 0x0D, 0x41, 0x8A, 0x00, 0xFF].randomElement(using: &generator)! }
            bytes.withUnsafeBytes { raw in
                for from in 0...length {
                    let expected = (from..<length).first { raw[$0] == 0x0A } ?? length
                    XCTAssertEqual(firstLF(raw, from: from, to: length), expected, "\(bytes) from \(from)")
                }
            }
        }
    }

    func testFieldValueCheckMatchesAByteLoop() {
        for value in 0...255 {
            for position in 0..<19 {
                var bytes = [UInt8](repeating: 0x61, count: 19)
                bytes[position] = UInt8(value)
                bytes.withUnsafeBytes { raw in
                    for start in 0...3 {
                        let range = start..<(19 - start)
                        let expected = range.allSatisfy { isFieldValueByte(raw[$0]) }
                        XCTAssertEqual(allFieldValueBytes(raw, range), expected, "byte \(value) at \(position), \(range)")
                    }
                }
            }
        }
    }

    func testCommonNameWordMatchesAByteLoop() {
        let common = { (b: UInt8) in isAlpha(b) || isDigit(b) || b == UInt8(ascii: "-") }
        for value in 0...255 {
            for position in 0..<8 {
                // Every other byte a letter, a digit or "-" in turn, so neighbours of each kind are tried.
                for filler in [UInt8(ascii: "a"), UInt8(ascii: "Z"), UInt8(ascii: "0"), UInt8(ascii: "-")] {
                    var bytes = [UInt8](repeating: filler, count: 8)
                    bytes[position] = UInt8(value)
                    let word = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)) }
                    XCTAssertEqual(isCommonNameWord(word), bytes.allSatisfy(common), "byte \(value) at \(position)")
                    // Whatever it skips is tchar without "_", and a byte loop agrees on the token check.
                    bytes.withUnsafeBytes { raw in
                        XCTAssertEqual(isToken(raw), bytes.allSatisfy(isTokenByteBySwitch), "byte \(value) at \(position)")
                    }
                }
            }
        }
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let length = Int.random(in: 0...40, using: &generator)
            let bytes = (0..<length).map { _ in [UInt8(0x2D), 0x2C, 0x2E, 0x5F, 0x61, 0x7B, 0x40, 0x5B, 0x3A, 0x39, 0x0D, 0xC1].randomElement(using: &generator)! }
            bytes.withUnsafeBytes { raw in
                for from in 0...length {
                    let skipped = skipCommonNameWords(raw, from: from, to: length)
                    XCTAssertTrue(skipped >= from && skipped <= length && (skipped - from) % 8 == 0)
                    XCTAssertTrue((from..<skipped).allSatisfy { common(raw[$0]) }, "\(bytes) from \(from)")
                    XCTAssertEqual(isToken(UnsafeRawBufferPointer(rebasing: raw[from...])),
                                   length > from && (from..<length).allSatisfy { isTokenByteBySwitch(raw[$0]) })
                }
            }
        }
    }

    func testCommonNameJudgesExactlyItsRange() {
        let common = { (b: UInt8) in isAlpha(b) || isDigit(b) || b == UInt8(ascii: "-") }
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<400 {
            let length = Int.random(in: 0...30, using: &generator)
            // Mostly common bytes, so that long common ranges occur; the others sit on the word edges too.
            let bytes = (0..<length).map { _ in
                Int.random(in: 0..<6, using: &generator) == 0
                    ? [UInt8(0x3A), 0x5F, 0x20, 0x0D, 0x2C, 0x7B, 0xC1, 0x00].randomElement(using: &generator)!
                    : [UInt8(0x61), 0x5A, 0x30, 0x2D, 0x39, 0x7A].randomElement(using: &generator)!
            }
            bytes.withUnsafeBytes { raw in
                for lower in 0...length {
                    for upper in lower...length {
                        let expected = upper > lower && (lower..<upper).allSatisfy { common(raw[$0]) }
                        let judged = isCommonName(raw, lower..<upper, readableEnd: length)
                        if judged { XCTAssertTrue(expected, "\(bytes) \(lower)..<\(upper)") }
                        // And it does say so whenever it can read a word.
                        if expected && (upper - lower >= 4 || lower + 8 <= length) { XCTAssertTrue(judged, "\(bytes) \(lower)..<\(upper)") }
                    }
                }
            }
        }
    }

    func testFieldValueCheckAtEveryLength() {
        for length in 0...25 {
            for position in 0..<max(length, 1) {
                for bad in [UInt8(0x00), 0x09, 0x0A, 0x0D, 0x1F, 0x7F, 0x80, 0xFF] {
                    var bytes = [UInt8](repeating: 0x61, count: length + 2)
                    if length > 0 { bytes[1 + position] = bad }
                    bytes[0] = 0x00   // outside the range: must not count
                    bytes[length + 1] = 0x7F
                    bytes.withUnsafeBytes { raw in
                        let range = 1..<(1 + length)
                        XCTAssertEqual(allFieldValueBytes(raw, range), range.allSatisfy { isFieldValueByte(raw[$0]) },
                                       "length \(length), byte \(bad) at \(position)")
                    }
                }
            }
        }
    }

    func testCaseInsensitiveComparisonMatchesAByteLoop() {
        let literals: [StaticString] = ["content-length", "transfer-encoding", "connection", "keep-alive", "close",
                                        "upgrade", "chunked", "host", "expect", "100-continue"]
        let reference = { (received: [UInt8], literal: StaticString) -> Bool in
            let wanted = Array(UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
            return received.count == wanted.count && zip(received, wanted).allSatisfy { asciiLower($0) == $1 }
        }
        for literal in literals {
            let base = Array(UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
            var variants = [base, base.map { $0 >= 0x61 && $0 <= 0x7A ? $0 - 0x20 : $0 }]
            // Each byte in turn replaced by every value: its case twin and its 0x20 neighbours among them.
            for position in base.indices {
                for value in 0...255 {
                    var changed = base
                    changed[position] = UInt8(value)
                    variants.append(changed)
                }
            }
            for variant in variants {
                // Framed by other bytes, so that a word read past the range would show.
                let framed = [UInt8(0x41)] + variant + [UInt8(0x41)]
                framed.withUnsafeBytes { raw in
                    XCTAssertEqual(equalsIgnoringCase(raw, 1..<(1 + variant.count), literal), reference(variant, literal), "\(variant)")
                }
            }
        }
    }

    func testRecordedLineEndsAnswerAsTheSearchWould() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            // Up to 60 line feeds: past the record's capacity too, where it must fall back to searching.
            let length = Int.random(in: 1...200, using: &generator)
            let bytes = (0..<length).map { _ in Int.random(in: 0..<4, using: &generator) == 0 ? UInt8(0x0A) : UInt8(0x61) }
            bytes.withUnsafeBytes { raw in
                for recorded in [true, false] {
                    var ends = LineEnds()
                    ends.begin(fromHeadStart: recorded)
                    for i in 0..<length where raw[i] == 0x0A { ends.record(i) }
                    // Increasing starts, as a parse asks: each just after the last answer, sometimes further.
                    var from = 0
                    while from <= length {
                        let answer = ends.lineFeed(in: raw, from: from, to: length)
                        XCTAssertEqual(answer, firstLF(raw, from: from, to: length), "\(bytes) from \(from)")
                        from = answer + 1 + Int.random(in: 0...2, using: &generator)
                    }
                }
            }
        }
    }

    func testHostByteSetsMatchTheSpelledOutSet() {
        for value in 0...255 {
            XCTAssertEqual(isRefusedInHost(UInt8(value)), isRefusedInHostBySwitch(UInt8(value)), "byte \(value)")
        }
    }

    func testFieldValueCheckIsTheByteRule() {
        for value in 0...255 {
            let bytes = [UInt8(ascii: "a"), UInt8(value), UInt8(ascii: "b")] + [UInt8](repeating: 0x41, count: 9)
            bytes.withUnsafeBytes { raw in
                XCTAssertEqual(isFieldValue(raw), isFieldValueByte(UInt8(value)), "byte \(value)")
            }
        }
    }

    func testTokenByteSetsMatchTheSpelledOutSet() {
        for value in 0...255 {
            XCTAssertEqual(isTokenByte(UInt8(value)), isTokenByteBySwitch(UInt8(value)), "byte \(value)")
        }
    }
}
