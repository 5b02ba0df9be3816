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

    func testTokenByteSetsMatchTheSpelledOutSet() {
        for value in 0...255 {
            XCTAssertEqual(isTokenByte(UInt8(value)), isTokenByteBySwitch(UInt8(value)), "byte \(value)")
        }
    }
}
