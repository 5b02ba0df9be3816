import XCTest
@testable import HTTPWire

/// An HTTP/2 upstream's header block as the HTTP/1.1 response head the relay reads (`HTTP2ResponseFields`).
final class HTTP2ResponseFieldsTests: XCTestCase {
    private func block(_ fields: [(String, String)], maxBytes: Int = 64 * 1024) -> (block: HTTP2ResponseFields, kept: Bool) {
        var block = HTTP2ResponseFields(maxBytes: maxBytes)
        block.begin()
        var kept = true
        for (name, value) in fields {
            kept = Array(name.utf8).withUnsafeBytes { name in Array(value.utf8).withUnsafeBytes { block.add(name: name, value: $0) } } && kept
        }
        return (block, kept)
    }

    private func text(_ fields: [(String, String)], method: HTTPMethod = .get, endStream: Bool = false) -> String {
        String(decoding: block(fields).block.http1Head(requestMethod: method, endStream: endStream, reason: "OK"), as: UTF8.self)
    }

    /// Reads the mapped head as the relay does (`headLimits` over an HTTP/1.1 upstream's limits).
    private func parsed(_ block: HTTP2ResponseFields, method: HTTPMethod = .get, endStream: Bool) throws -> ResponseHead? {
        var bytes = block.http1Head(requestMethod: method, endStream: endStream, reason: "OK")
        var parser = HeadParser(limits: block.headLimits(HTTPWireLimits(maxHeadBytes: 256 * 1024), headBytes: bytes.count))
        var head = ResponseHead()
        let complete = try bytes.withUnsafeMutableBytes { buffer throws(HTTPWireError) in try parser.parseResponse(buffer, requestMethod: method, into: &head) }
        return complete ? head : nil
    }

    func testStatusMakesTheStatusLineAndFieldsFollowAsTheyCame() {
        XCTAssertEqual(text([(":status", "404"), ("content-type", "text/plain"), ("content-length", "3")]),
                       "HTTP/1.1 404 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\n\r\n")
    }

    func testFramingIsAddedOnlyWhereTheResponseHasABodyWithoutLength() {
        XCTAssertTrue(text([(":status", "200")]).hasSuffix("transfer-encoding: chunked\r\n\r\n"))
        XCTAssertTrue(text([(":status", "200")], endStream: true).hasSuffix("content-length: 0\r\n\r\n"))
        XCTAssertEqual(text([(":status", "204")], endStream: true), "HTTP/1.1 204 OK\r\n\r\n")
        XCTAssertEqual(text([(":status", "304")]), "HTTP/1.1 304 OK\r\n\r\n")
        XCTAssertEqual(text([(":status", "200")], method: .head, endStream: true), "HTTP/1.1 200 OK\r\n\r\n")
    }

    func testAStatusThatIsNotThreeDigitsLeavesTheHeadWithoutOne() throws {
        for bad in ["20", "2000", "2x0", "+20"] {
            let made = block([(":status", bad)]).block
            XCTAssertEqual(made.status, -1, bad)
            XCTAssertThrowsError(try parsed(made, endStream: true), bad)
        }
        XCTAssertThrowsError(try parsed(block([(":status", "099")]).block, endStream: true), "below 100")
        XCTAssertTrue(block([(":status", "103")]).block.isInterim)
    }

    func testPseudoHeadersNeverBecomeFieldLines() {
        XCTAssertEqual(text([(":status", "200"), (":path", "/x"), ("content-length", "0")]), "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    }

    func testTheBlockIsBoundedWhileItIsDecoded() {
        let over = block([(":status", "200"), ("x-big", String(repeating: "v", count: 100))], maxBytes: 100)
        XCTAssertFalse(over.kept)
        XCTAssertEqual(over.block.fields.count, 0, "nothing kept past the bound")
        XCTAssertTrue(block([(":status", "200"), ("x-big", String(repeating: "v", count: 70))], maxBytes: 100).kept)
    }

    /// Found by the response fuzz target: 256 fields (what an HTTP/1.1 upstream may send) plus the framing
    /// line the mapping adds made 257, and the head was refused from an HTTP/2 upstream only.
    func testAsManyFieldsAsAnHTTP1UpstreamMaySendAreAccepted() throws {
        let fields = [(":status", "200")] + (0..<256).map { ("x-f\($0)", "1") }
        for endStream in [true, false] {
            let head = try XCTUnwrap(try parsed(block(fields).block, endStream: endStream))
            XCTAssertEqual(head.fields.count, 257)
        }
        XCTAssertThrowsError(try parsed(block(fields + [("x-one-more", "1")]).block, endStream: true), "the HTTP/1.1 limit still holds")
    }

    func testBeginStartsANewBlock() {
        var made = block([(":status", "200"), ("a", "1")]).block
        made.begin()
        XCTAssertEqual(made.status, -1)
        XCTAssertEqual(made.fields.count, 0)
        XCTAssertEqual(made.lineBytes, 0)
    }
}
