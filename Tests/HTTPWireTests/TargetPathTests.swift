import HTTPWire
import XCTest

/// Issue 14 item 14: dot segments are resolved before any decision on the path, and prefixes match on
/// segment boundaries.
final class TargetPathTests: XCTestCase {
    private func normalised(_ path: String) -> String {
        String(decoding: TargetPath.removingDotSegments(Array(path.utf8)[...]), as: UTF8.self)
    }

    func testDotSegmentsAreResolved() {
        XCTAssertEqual(normalised("/../../etc/passwd"), "/etc/passwd", "never above the root")
        XCTAssertEqual(normalised("/x/../public/x"), "/public/x")
        XCTAssertEqual(normalised("/a/./b/../c"), "/a/c")
        XCTAssertEqual(normalised("/a/b/.."), "/a/")
        XCTAssertEqual(normalised("/a/b/."), "/a/b/")
        XCTAssertEqual(normalised("/.."), "/")
        XCTAssertEqual(normalised("/"), "/")
        XCTAssertEqual(normalised("/a//b/"), "/a//b/", "empty segments are not dot segments")
        XCTAssertEqual(normalised("/x/%2e%2E/public/y"), "/public/y", "percent-encoded dots count")
        XCTAssertEqual(normalised("/x/.%2e/y"), "/y")
        XCTAssertEqual(normalised("/a/.../b"), "/a/.../b", "three dots are a name")
        XCTAssertEqual(normalised("/a/.b/c."), "/a/.b/c.")
        XCTAssertEqual(normalised("/caf%C3%A9/%2F"), "/caf%C3%A9/%2F", "nothing else is decoded")
    }

    func testDetection() {
        XCTAssertTrue(TargetPath.hasDotSegments(Array("/a/../b".utf8)[...]))
        XCTAssertTrue(TargetPath.hasDotSegments(Array("/a/%2E".utf8)[...]))
        XCTAssertFalse(TargetPath.hasDotSegments(Array("/a/..b/c".utf8)[...]))
    }

    func testPrefixesMatchOnSegmentBoundaries() {
        let prefix = Array("/public".utf8)
        XCTAssertTrue(TargetPath.hasPrefix(Array("/public".utf8)[...], prefix))
        XCTAssertTrue(TargetPath.hasPrefix(Array("/public/x".utf8)[...], prefix))
        XCTAssertFalse(TargetPath.hasPrefix(Array("/publicity".utf8)[...], prefix))
        XCTAssertFalse(TargetPath.hasPrefix(Array("/pub".utf8)[...], prefix))
        XCTAssertTrue(TargetPath.hasPrefix(Array("/public/x".utf8)[...], Array("/public/".utf8)))
    }

    func testSplitKeepsTheQuery() {
        let target = Array("/a/../b?x=/../y".utf8)[...]
        let (path, query) = TargetPath.split(target)
        XCTAssertEqual(String(decoding: path, as: UTF8.self), "/a/../b")
        XCTAssertEqual(String(decoding: query, as: UTF8.self), "?x=/../y")
        XCTAssertEqual(String(decoding: TargetPath.removingDotSegments(path), as: UTF8.self), "/b")
    }
}
