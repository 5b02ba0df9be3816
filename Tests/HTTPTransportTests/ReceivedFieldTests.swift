@testable import HTTPTransport
import HTTPWire
import XCTest

/// Fields of a received head are written on without their bytes being checked again: what makes that safe
/// is that only a head the parser accepted lends them. These tests parse real heads, write their fields
/// into a block, and read the result back with the parser.
final class ReceivedFieldTests: XCTestCase {
    private func received(_ text: String) throws -> ReceivedRequestHead {
        var bytes = Array(text.utf8)
        var parser = HeadParser()
        var head = RequestHead()
        let complete = try bytes.withUnsafeMutableBytes { try parser.parseRequest($0, into: &head) }
        XCTAssertTrue(complete)
        // The parser rewrites folded lines in place; the transport copies the head after parsing it.
        return ReceivedRequestHead(bytes: Array(bytes[..<head.headLength]), parsed: head)
    }

    private func fieldLines(_ block: HTTPFieldBlock) throws -> [String] {
        let text = String(decoding: block.serialized, as: UTF8.self)
        XCTAssertTrue(text.isEmpty || text.hasSuffix("\r\n"))
        // Read back as a head: every line must still be a field the parser accepts.
        _ = try received("GET / HTTP/1.0\r\n" + text + "\r\n")
        return text.components(separatedBy: "\r\n").filter { !$0.isEmpty }
    }

    func testReceivedFieldsGoOnAsTheyCameButTheTransportsOwn() throws {
        let head = try received("POST /x HTTP/1.1\r\nHost: a\r\nX-Tab: a\tb \r\nContent-Length: 0\r\nConnection: keep-alive\r\n"
            + "Expect: 100-continue\r\nx_under: 1\r\nVia:\r\n\r\n")
        var block = HTTPFieldBlock()
        head.withFields { fields in
            for index in 0..<fields.count { block.appendReceived(index, of: fields) }
        }
        XCTAssertEqual(try fieldLines(block), ["Host: a", "X-Tab: a\tb", "Expect: 100-continue", "x_under: 1", "Via: "])

        var withoutExpect = HTTPFieldBlock()
        withoutExpect.dropsExpect = true
        head.withFields { fields in
            for index in 0..<fields.count { withoutExpect.appendReceived(index, of: fields) }
        }
        XCTAssertEqual(try fieldLines(withoutExpect), ["Host: a", "X-Tab: a\tb", "x_under: 1", "Via: "])
    }

    /// A folded value reaches the block with its line breaks already spaces: no received value can split a
    /// head written from it.
    func testFoldedValuesCannotSplitTheHead() throws {
        let head = try received("GET / HTTP/1.1\r\nHost: a\r\nX-Folded: one\r\n  Injected: two\r\n\r\n")
        var block = HTTPFieldBlock()
        head.withFields { fields in
            for index in 0..<fields.count { block.appendReceived(index, of: fields) }
        }
        XCTAssertEqual(try fieldLines(block), ["Host: a", "X-Folded: one    Injected: two"])
    }

    func testReceivedValuesJoinAList() throws {
        let head = try received("GET / HTTP/1.1\r\nHost: a\r\nVia: 1.0 edge\r\nVia: 1.1 inner\r\n\r\n")
        var block = HTTPFieldBlock()
        head.withFields { fields in
            block.startField(name: "Via")
            for index in 1..<fields.count {
                block.appendReceivedValue(index, of: fields)
                block.appendToValue(", ")
            }
            block.appendToValue("1.1 tokenrelay")
            block.endField()
        }
        XCTAssertEqual(try fieldLines(block), ["Via: 1.0 edge, 1.1 inner, 1.1 tokenrelay"])
    }

    /// What the proxy makes itself is still checked: a received value in a list does not make a bad piece
    /// after it acceptable.
    func testMadePiecesAreStillChecked() throws {
        let head = try received("GET / HTTP/1.1\r\nHost: a\r\nVia: 1.0 edge\r\n\r\n")
        var block = HTTPFieldBlock()
        head.withFields { fields in
            block.startField(name: "Via")
            block.appendReceivedValue(1, of: fields)
            block.appendToValue("\r\nInjected: 1")
            block.endField()
            block.append(name: "Authorization", value: "Bearer a\r\nInjected: 1")
            block.append(name: "X-Ok", value: "1")
        }
        XCTAssertEqual(try fieldLines(block), ["X-Ok: 1"])
    }
}
