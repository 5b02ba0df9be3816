import XCTest
@testable import TokenRelay

/// The dot-segment rule, scanned as bytes on every request: `.` and `..` segments, percent-encoded ones
/// included, before any query; everything else is an ordinary segment.
final class DotSegmentScanTests: XCTestCase {
    func testDotSegmentsAreFound() {
        for target in ["/.", "/..", "/a/./b", "/a/../b", "/%2e", "/%2E%2e/x", "/.%2e/", "/x/..?y=1", "/x/..#f", "/a//../b"] {
            XCTAssertTrue(RequestTarget.hasDotSegment(target), target)
        }
    }

    func testOtherSegmentsAreNot() {
        for target in ["/", "/a", "/.../x", "/a.b", "/.well-known/x", "/%2", "/%2f", "/%2e%2e%2e", "/x?/../", "/x#/..", "/a/b.", "/..a", "/%2ex", ""] {
            XCTAssertFalse(RequestTarget.hasDotSegment(target), target)
        }
    }

    func testJitterStaysInTheUnitInterval() {
        var source = JitterSource(seed: 42)
        var sum = 0.0
        for _ in 0..<10_000 {
            let value = source.next()
            XCTAssertTrue(value >= 0 && value < 1)
            sum += value
        }
        XCTAssertEqual(sum / 10_000, 0.5, accuracy: 0.02)
    }
}
