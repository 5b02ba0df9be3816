import HTTPWire
import XCTest

final class ResponseHeadTests: XCTestCase {

    func testStatusLine() throws {
        let ok = try XCTUnwrap(parseResponse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"))
        XCTAssertEqual(ok.head.status, 200)
        XCTAssertEqual(ok.text(ok.head.reason), "OK")
        XCTAssertEqual(ok.head.semantics.framing, .length(2))
        XCTAssertEqual(ok.head.headLength, ok.bytes.count - 2)
        XCTAssertEqual(try parseResponse("HTTP/1.1 404 \r\n\r\n")?.head.status, 404)
        XCTAssertEqual(try parseResponse("HTTP/1.1 404\r\n\r\n")?.head.status, 404, "missing SP before an empty reason")
        XCTAssertEqual(try parseResponse("HTTP/1.0 200 OK\r\n\r\n")?.head.semantics.version, .http10)
        for bad in ["HTTP/1.1 20 OK", "HTTP/1.1 2000 OK", "HTTP/1.1 099 X", "HTTP/1.1 600 X", "HTTP/1.1  200 OK", "HTTP/1.1 abc OK", "HTTP/1.1 200x"] {
            XCTAssertEqual(responseError(bad + "\r\n\r\n"), .invalidStatus, bad)
        }
        XCTAssertEqual(responseError("HTTP/1.2 200 OK\r\n\r\n"), .unsupportedVersion)
        XCTAssertEqual(responseError("HTTP/2 200\r\n\r\n"), .invalidVersion)
        XCTAssertEqual(responseError("HTTP/1.1 200 O\u{0}K\r\n\r\n"), .invalidReason)
    }

    /// Issue 14 item 8: conflicting framing in a response is an error, never relayed as-is.
    func testConflictingResponseFramingIsAnError() {
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\n"), .conflictingContentLength)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nContent-Length: 5, 50\r\n\r\n"), .conflictingContentLength)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), .contentLengthWithTransferEncoding)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"), .contentLengthWithTransferEncoding)
        XCTAssertEqual(responseError("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), .transferEncodingInHTTP10)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"), .chunkedNotFinal)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n"), .invalidContentLength)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n"), .contentLengthTooLarge)
        // Checked even where no body follows.
        XCTAssertEqual(responseError("HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"), .conflictingContentLength)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", method: .head), .contentLengthWithTransferEncoding)
    }

    func testIdenticalDuplicateLengthsAreOneLength() throws {
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")?.head.semantics.framing, .length(5))
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n")?.head.semantics.framing, .length(5))
    }

    /// 1xx, 204 and 304 responses and responses to HEAD have no body, whatever their fields say; bytes
    /// after such a head are the next response (or a desync the connection layer must catch).
    func testResponsesWithoutBody() throws {
        for status in [100, 101, 103, 204, 304] {
            let head = try XCTUnwrap(parseResponse("HTTP/1.1 \(status) X\r\nContent-Length: 7\r\n\r\nforged!"))
            XCTAssertEqual(head.head.semantics.framing, BodyFraming.none, "\(status)")
            XCTAssertEqual(head.head.headLength, head.bytes.count - 7)
        }
        XCTAssertTrue(try XCTUnwrap(parseResponse("HTTP/1.1 100 Continue\r\n\r\n")).head.isInformational)
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n", method: .head)?.head.semantics.framing, BodyFraming.none)
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\n\r\n", method: .connect)?.head.semantics.framing, BodyFraming.none)
    }

    func testChunkedAndCloseDelimited() throws {
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")?.head.semantics.framing, .chunked)
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n")?.head.semantics.framing, .chunked)
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n")?.head.semantics.framing, .untilClose)
        XCTAssertEqual(try parseResponse("HTTP/1.1 200 OK\r\n\r\n")?.head.semantics.framing, .untilClose)
        XCTAssertEqual(try parseResponse("HTTP/1.0 200 OK\r\n\r\n")?.head.semantics.framing, .untilClose)
    }

    func testFieldSyntaxIsAsStrictAsForRequests() {
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nSet-Cookie: a\u{0}b\r\n\r\n"), .invalidFieldValue)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n"), .whitespaceBeforeColon)
        XCTAssertEqual(responseError("HTTP/1.1 200 OK\r\n: x\r\n\r\n"), .emptyFieldName)
    }
}
