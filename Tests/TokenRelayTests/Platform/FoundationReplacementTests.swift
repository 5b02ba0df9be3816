import Foundation
import XCTest
@testable import TokenRelay

/// The release binary does without Foundation's text and date helpers; these tests hold each
/// replacement to what Foundation answers for the same input (the tests may still link Foundation).
final class FoundationReplacementTests: XCTestCase {
    func testRFC3339ParsesWhatISO8601DateFormatterParsedAndRefusesTheRest() {
        let plain = ISO8601DateFormatter()
        plain.formatOptions = [.withInternetDateTime]
        let fractional = ISO8601DateFormatter()
        fractional.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        let inputs = ["2026-11-21T10:00:00Z", "1970-01-01T00:00:00Z", "2000-02-29T23:59:59Z", "9999-12-31T23:59:59Z",
                      "2026-11-21T10:00:00+01:00", "2026-11-21T10:00:00-07:30", "2026-11-21T10:00:00.5Z",
                      "2026-11-21T10:00:00.250+02:00", "2026-11-21T10:00:00.123456Z", "1999-12-31T23:59:59.999Z"]
        for input in inputs {
            let expected = plain.date(from: input) ?? fractional.date(from: input)
            XCTAssertNotNil(expected, input)
            guard let expected, let actual = RFC3339.parse(input) else { XCTFail("RFC3339 refused \(input)"); continue }
            XCTAssertEqual(actual.timeIntervalSince1970, expected.timeIntervalSince1970, accuracy: 0.001, input)
        }
        for bad in ["", "2026-11-21", "2026-11-21T10:00:00", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z",
                    "2026-11-21T24:00:00Z", "2026-11-21T10:60:00Z", "2026-11-21T10:00:00.Z", "2026-11-21T10:00:00Zjunk",
                    "26-11-21T10:00:00Z", "2026-11-21 10:00:00Z", "1700000000"] {
            XCTAssertNil(RFC3339.parse(bad), bad)
        }
    }

    func testRFC3339WritesWhatISO8601DateFormatterWrote() {
        let plain = ISO8601DateFormatter()
        plain.formatOptions = [.withInternetDateTime]
        let fractional = ISO8601DateFormatter()
        fractional.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        for seconds in [0, 1_763_719_200, 951_868_799, 253_402_300_799, 1_799_913_630.25, 1_799_913_630.999] as [Double] {
            let date = Date(timeIntervalSince1970: seconds)
            XCTAssertEqual(RFC3339.format(date), plain.string(from: date))
            XCTAssertEqual(RFC3339.formatWithMilliseconds(date), fractional.string(from: date))
            XCTAssertEqual(RFC3339.parse(RFC3339.format(date))?.timeIntervalSince1970, seconds.rounded(.down))
        }
    }

    func testHTTPDateReadsIMFFixdate() {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        for input in ["Sun, 06 Nov 1994 08:49:37 GMT", "Thu, 14 Jan 2027 08:00:30 GMT", "Tue, 29 Feb 2028 23:59:59 GMT",
                      "Fri, 31 Dec 9999 23:59:59 GMT", "Thu, 01 Jan 1970 00:00:00 GMT"] {
            XCTAssertEqual(HTTPDate.parse(input), formatter.date(from: input), input)
        }
        for bad in ["", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "Sun, 06 Nov 1994 08:49:37 UTC",
                    "Sun, 06 Nov 1994 08:49:37", "Sun, 31 Feb 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:49:37 GMT"] {
            XCTAssertNil(HTTPDate.parse(bad), bad)
        }
    }

    func testFilePathMatchesNSStringPathComponents() {
        for path in ["/var/lib/tokenrelay/tokens.json", "tokens.json", "./tokens.json", "/tokens.json", "/", "dir/sub/",
                     "/var/lib//tokens.json", "a/b", "../x/y.json"] {
            XCTAssertEqual(FilePath.parent(of: path), (path as NSString).deletingLastPathComponent, path)
            XCTAssertEqual(FilePath.lastComponent(of: path), (path as NSString).lastPathComponent, path)
        }
    }

    func testTrimmingMatchesCharacterSets() {
        for text in ["  a b \t", "\u{00A0}x\u{2003}", "\n\r\nsecret\n", "\u{2028}s\u{0085}", "", " ", "\n", "a\nb", "\u{FEFF}x"] {
            XCTAssertEqual(text.trimmingWhitespace(), text.trimmingCharacters(in: .whitespaces), text.debugDescription)
            XCTAssertEqual(text.trimmingNewlines(), text.trimmingCharacters(in: .newlines), text.debugDescription)
        }
    }

    func testCFormatMatchesStringFormat() {
        XCTAssertEqual(cFormat("%02x", UInt8(7)), String(format: "%02x", UInt8(7)))
        XCTAssertEqual(cFormat("%04o", mode_t(0o640)), String(format: "%04o", mode_t(0o640)))
        XCTAssertEqual(cFormat("\\u%04x", UInt32(0x1F)), String(format: "\\u%04x", UInt32(0x1F)))
        for value in [0.0, 0.005, 1.235, 2.5, 1e9, -3.14159] {
            XCTAssertEqual(cFormat("%.2f s", value), String(format: "%.2f s", value))
        }
        XCTAssertEqual(cFormat("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int32(2026), Int32(1), Int32(2), Int32(3), Int32(4), Int32(5), Int32(6)),
                       "2026-01-02T03:04:05.006Z")
        let long = String(repeating: "x", count: 200)
        XCTAssertEqual(cFormat("%@-%d".replacingOccurrences(of: "%@", with: long), Int32(5)), long + "-5", "longer than the first buffer")
    }

    func testCaseInsensitiveSearch() {
        XCTAssertEqual("Basic realm=x, BEARER error=y".rangeIgnoringASCIICase(of: "bearer").map { "Basic realm=x, BEARER error=y"[$0] }, "BEARER")
        XCTAssertNil("Basic realm=x".rangeIgnoringASCIICase(of: "bearer"))
        XCTAssertNil("bear".rangeIgnoringASCIICase(of: "bearer"))
    }
}

/// The fingerprint is computed through the shim's direct SHA-256 (not OpenSSL's provider path).
final class TokenFingerprintTests: XCTestCase {
    func testFingerprintIsTheStartOfTheSHA256() {
        XCTAssertEqual(TokenFingerprint.of("abc"), "sha256:ba7816bf8f01")
        XCTAssertEqual(TokenFingerprint.of(""), "sha256:e3b0c44298fc")
        XCTAssertEqual(TokenFingerprint.of(String(repeating: "a", count: 1000)), "sha256:41edece42d63")
    }
}
