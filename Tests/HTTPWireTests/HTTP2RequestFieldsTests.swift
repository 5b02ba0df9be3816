import XCTest
@testable import HTTPWire

/// An HTTP/2 request's fields as the HTTP/1.1 head the upstream gets (`HTTP2RequestFields`).
final class HTTP2RequestFieldsTests: XCTestCase {
    private func head(_ fields: [(String, String)], endStream: Bool = true, maxBytes: Int = 64 * 1024) -> (fields: HTTP2RequestFields, text: String) {
        var list = HTTP2RequestFields(maxBytes: maxBytes)
        for (name, value) in fields {
            Array(name.utf8).withUnsafeBytes { name in Array(value.utf8).withUnsafeBytes { list.add(name: name, value: $0) } }
        }
        return (list, String(decoding: list.http1Head(endStream: endStream), as: UTF8.self))
    }

    private let request = [(":method", "GET"), (":scheme", "https"), (":authority", "api.example"), (":path", "/v1?x=1")]

    func testPseudoHeadersMakeTheRequestLineAndHost() {
        XCTAssertEqual(head(request + [("accept", "*/*")]).text, "GET /v1?x=1 HTTP/1.1\r\nhost: api.example\r\naccept: */*\r\n\r\n")
    }

    func testAHostBesideTheAuthorityIsLeftOut() {
        XCTAssertEqual(head(request + [("host", "evil.example")]).text, "GET /v1?x=1 HTTP/1.1\r\nhost: api.example\r\n\r\n")
    }

    func testSplitCookiesAreJoined() {
        XCTAssertEqual(head(request + [("cookie", "a=1"), ("x", "y"), ("cookie", "b=2")]).text,
                       "GET /v1?x=1 HTTP/1.1\r\nhost: api.example\r\nx: y\r\ncookie: a=1; b=2\r\n\r\n")
    }

    func testABodyWithoutLengthIsFramedChunked() {
        XCTAssertTrue(head(request, endStream: false).text.hasSuffix("transfer-encoding: chunked\r\n\r\n"))
        XCTAssertFalse(head(request + [("content-length", "5")], endStream: false).text.contains("transfer-encoding"))
        XCTAssertFalse(head(request, endStream: true).text.contains("transfer-encoding"))
    }

    func testTheListIsMeasuredAsHTTP2MeasuresIt() {
        let fields = head(request + [("x-big", String(repeating: "a", count: 100))], maxBytes: 200).fields
        XCTAssertTrue(fields.isOverLimit)
        XCTAssertEqual(fields.listSize, request.reduce(0) { $0 + $1.0.count + $1.1.count + 32 } + 5 + 100 + 32)
    }

    /// What HTTPWire makes of the result: the whole head, the same method and target.
    func testTheHeadParsesWhole() throws {
        var bytes = head(request + [("content-length", "3")], endStream: false).fields.http1Head(endStream: false)
        var parser = HeadParser()
        var parsed = RequestHead()
        let count = bytes.count
        let complete = try bytes.withUnsafeMutableBytes { try parser.parseRequest($0, into: &parsed) }
        XCTAssertTrue(complete)
        XCTAssertEqual(parsed.headLength, count)
        XCTAssertEqual(parsed.semantics.framing, .length(3))
    }
}
