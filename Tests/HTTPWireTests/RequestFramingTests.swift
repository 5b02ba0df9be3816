import HTTPWire
import XCTest

/// Request body framing (RFC 9112 section 6), including every framing and syntax probe of
/// Tests/TokenRelayTests/Proxy/RequestHygieneTests.swift: each one that is a matter of syntax is a parse error
/// here; the three that are policy (foreign absolute-form, asterisk-form, CONNECT) parse, and their
/// target form is what lets the proxy refuse them.
final class RequestFramingTests: XCTestCase {
    private let host = "Host: 127.0.0.1:8080\r\n"

    func testLengthChunkedAndNone() throws {
        XCTAssertEqual(try parseRequest("POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\n\r\nabc")?.head.semantics.framing, .length(3))
        XCTAssertEqual(try parseRequest("POST /x HTTP/1.1\r\n\(host)Content-Length: 0\r\n\r\n")?.head.semantics.framing, BodyFraming.none)
        XCTAssertEqual(try parseRequest("POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: Chunked\r\n\r\n")?.head.semantics.framing, .chunked)
        XCTAssertEqual(try parseRequest("POST /x HTTP/1.1\r\n\(host)\r\n")?.head.semantics.framing, BodyFraming.none)
        let parsed = try XCTUnwrap(parseRequest("POST /x HTTP/1.1\r\n\(host)Content-Length: 00012\r\n\r\n"))
        XCTAssertEqual(parsed.head.semantics.framing, .length(12), "leading zeros are still decimal digits")
        XCTAssertEqual(parsed.head.semantics.contentLengthCount, 1)
    }

    func testEverySmugglingProbeOfTheHygieneSuiteIsRefused() {
        let probes: [(String, String, HTTPWireError)] = [
            ("duplicate Content-Length", "POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", .duplicateContentLength),
            ("conflicting Content-Length", "POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde", .conflictingContentLength),
            ("Content-Length list", "POST /x HTTP/1.1\r\n\(host)Content-Length: 3, 3\r\n\r\nabc", .invalidContentLength),
            ("Content-Length +3", "POST /x HTTP/1.1\r\n\(host)Content-Length: +3\r\n\r\nabc", .invalidContentLength),
            ("Content-Length -1", "POST /x HTTP/1.1\r\n\(host)Content-Length: -1\r\n\r\n", .invalidContentLength),
            ("Content-Length hex", "POST /x HTTP/1.1\r\n\(host)Content-Length: 0x3\r\n\r\nabc", .invalidContentLength),
            ("empty Content-Length", "POST /x HTTP/1.1\r\n\(host)Content-Length: \r\n\r\n", .invalidContentLength),
            ("CL with TE", "POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", .contentLengthWithTransferEncoding),
            ("TE gzip, chunked", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", .unsupportedTransferEncoding),
            ("TE chunked, gzip", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n", .chunkedNotFinal),
            ("TE twice", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", .chunkedNotFinal),
            ("TE identity", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc", .contentLengthWithTransferEncoding),
            ("TE xchunked", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", .unsupportedTransferEncoding),
            ("empty header name", "GET /x HTTP/1.1\r\n\(host): value\r\n\r\n", .emptyFieldName),
            ("space in header name", "GET /x HTTP/1.1\r\n\(host)Bad Name: value\r\n\r\n", .whitespaceBeforeColon),
            ("space before colon", "GET /x HTTP/1.1\r\n\(host)Content-Length : 0\r\n\r\n", .whitespaceBeforeColon),
            ("control character in value", "GET /x HTTP/1.1\r\n\(host)X-A: a\u{01}b\r\n\r\n", .invalidFieldValue),
            ("DEL in value", "GET /x HTTP/1.1\r\n\(host)X-A: a\u{7F}b\r\n\r\n", .invalidFieldValue),
            ("bare CR in value", "GET /x HTTP/1.1\r\n\(host)X-A: a\rb\r\n\r\n", .invalidFieldValue),
            ("HTTP/1.1 without Host", "GET /x HTTP/1.1\r\n\r\n", .missingHost),
            ("two Host headers", "GET /x HTTP/1.1\r\n\(host)Host: evil.example\r\n\r\n", .duplicateHost),
            // Not in the hygiene suite, same family:
            ("TE in HTTP/1.0", "POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", .transferEncodingInHTTP10),
            ("TE empty", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: \r\n\r\n", .unsupportedTransferEncoding),
            ("TE chunked twice in one field", "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: chunked, chunked\r\n\r\n", .chunkedNotFinal),
            ("Content-Length with inner space", "POST /x HTTP/1.1\r\n\(host)Content-Length: 1 2\r\n\r\n", .invalidContentLength),
            ("Content-Length 3, 5", "POST /x HTTP/1.1\r\n\(host)Content-Length: 3, 5\r\n\r\n", .conflictingContentLength),
        ]
        for (name, text, expected) in probes {
            XCTAssertEqual(requestError(text), expected, name)
            XCTAssertEqual(requestError(text)?.requestStatus ?? 0 >= 400, true, name)
        }
    }

    func testPolicyProbesParseWithTheirTargetForm() throws {
        XCTAssertEqual(try parseRequest("GET http://evil.example/steal HTTP/1.1\r\nHost: evil.example\r\n\r\n")?.head.targetForm, .absolute)
        XCTAssertEqual(try parseRequest("GET http://user@127.0.0.1:8080/x HTTP/1.1\r\n\(host)\r\n")?.head.targetForm, .absolute)
        XCTAssertEqual(try parseRequest("OPTIONS * HTTP/1.1\r\n\(host)\r\n")?.head.targetForm, .asterisk)
        let connect = try XCTUnwrap(parseRequest("CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n"))
        XCTAssertEqual(connect.head.method, .connect)
        XCTAssertEqual(connect.head.targetForm, .authority)
    }

    /// Issue 14 item 12: an unparsable or overflowing length is an error as soon as the head is complete
    /// (400, no waiting for a body); a valid length over the body limit is known before any body byte, so
    /// the proxy can answer 413 before sending 100 Continue.
    func testOverlongContentLengthIsRefusedAtOnce() throws {
        for value in ["99999999999999999999999", "9223372036854775808", "18446744073709551616"] {
            let error = requestError("POST /x HTTP/1.1\r\n\(host)Content-Length: \(value)\r\n\r\n")
            XCTAssertEqual(error, .contentLengthTooLarge, value)
            XCTAssertEqual(error?.requestStatus, 400)
        }
        XCTAssertEqual(try parseRequest("POST /x HTTP/1.1\r\n\(host)Content-Length: 9223372036854775807\r\n\r\n")?.head.semantics.framing,
                       .length(Int.max))
        let big = try XCTUnwrap(parseRequest("POST /x HTTP/1.1\r\n\(host)Expect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n"))
        XCTAssertEqual(big.head.semantics.framing, .length(1_000_000_000))
        XCTAssertTrue(big.head.expectsContinue)
        XCTAssertEqual(big.head.headLength, big.bytes.count)
    }
}
