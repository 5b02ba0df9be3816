@testable import HTTPTransport
import XCTest

/// The check every outgoing field passes (request and response heads): the framing fields stay the
/// transport's whatever their case, and no name or value can end or split the head.
final class SendableFieldTests: XCTestCase {
    func testOrdinaryFieldsPass() {
        XCTAssertTrue(isSendableField("Authorization", "Bearer abc"))
        XCTAssertTrue(isSendableField("X-Custom_Name", "a\tb"))
        XCTAssertTrue(isSendableField("Content-Type", "text/plain; charset=utf-8"))
        XCTAssertTrue(isSendableField("Connection-Id", "1"))   // a prefix of "connection" is another field
        XCTAssertTrue(isSendableField("Content-Lengths", "1"))
    }

    func testFramingFieldsAreRefusedInAnyCase() {
        for name in ["Content-Length", "content-length", "CONTENT-LENGTH", "Transfer-Encoding", "transfer-ENCODING",
                     "Connection", "connection"] {
            XCTAssertFalse(isSendableField(name, "x"), name)
        }
    }

    func testTokenBytesAreExactlyTheTcharSet() {
        let tchar = Set("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".utf8)
        for value in 0...255 {
            let byte = [UInt8(value)]
            XCTAssertEqual(byte.withUnsafeBytes { isToken($0) }, tchar.contains(UInt8(value)), "byte \(value)")
        }
    }

    func testNamesMustBeTokens() {
        for name in ["", "Bad Name", "Bad:Name", "Bad\r\nName", "Bäd", "X(y)"] {
            XCTAssertFalse(isSendableField(name, "x"), name)
        }
    }

    func testValuesWithControlsAreRefused() {
        for value in ["a\r\nInjected: 1", "a\nb", "a\u{0}b", "a\u{7F}b", "a\u{1B}b"] {
            XCTAssertFalse(isSendableField("X-Test", value), value.debugDescription)
        }
    }

    /// A prepared field is judged once, when made, by the same rules: one that would be refused is never made.
    func testPreparedFieldsAreCheckedWhenMade() {
        XCTAssertNil(PreparedField(name: "Authorization", value: "Bearer a\r\nInjected: 1"))
        XCTAssertNil(PreparedField(name: "Authorization", value: "Bearer a\nb"))
        XCTAssertNil(PreparedField(name: "Bad Name", value: "x"))
        XCTAssertNil(PreparedField(name: "", value: "x"))
        XCTAssertNil(PreparedField(name: "content-LENGTH", value: "1"))
        XCTAssertNil(PreparedField(name: "Connection", value: "close"))
        let host = PreparedField(name: "Host", value: "api.example:8443")
        let expect = PreparedField(name: "Expect", value: "x")
        XCTAssertNotNil(host)
        var block = HTTPFieldBlock()
        block.dropsExpect = true
        if let host, let expect {
            block.append(host)
            block.append(expect)
            block.startField(name: "Via")
            block.append(host)   // not inside a field being written in pieces
            block.appendToValue("1.1 x")
            block.endField()
        }
        XCTAssertEqual(String(decoding: block.serialized, as: UTF8.self), "Host: api.example:8443\r\nVia: 1.1 x\r\n")
    }

    func testReasonControlsAreDroppedFromTheStatusLine() {
        let head = serializeResponseHead(HTTPResponseHead(status: 200, reason: "O\r\nK\u{7F}"), version: .http11,
                                         framing: .length(0), close: false)
        XCTAssertEqual(String(decoding: head, as: UTF8.self), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    }
}

/// Numbers in heads (status codes, lengths) are written without a String: the digits must be exactly
/// what `String(n)` says, across the one-word path and the longer one.
final class HeadDecimalTests: XCTestCase {
    func testDecimalsMatchTheirText() {
        var values = [0, 1, 9, 10, 99, 100, 200, 599, 4096, 65_535, 99_999_999, 100_000_000, 123_456_789_012,
                      Int.max, -1, -200, -99_999_999, -100_000_000, Int.min]
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<500 { values.append(Int.random(in: Int.min...Int.max, using: &generator) >> Int.random(in: 0...62, using: &generator)) }
        for value in values {
            let buffer = HeadBuffer()
            buffer.append(literal: "x")
            buffer.appendDecimal(value)
            buffer.append(literal: "y")
            XCTAssertEqual(String(decoding: buffer.bytes, as: UTF8.self), "x\(value)y")
        }
    }
}
