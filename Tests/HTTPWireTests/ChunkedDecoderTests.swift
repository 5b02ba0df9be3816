import HTTPWire
import XCTest

/// Issue 14 item 11 and the rest of RFC 9112 section 7.1.
final class ChunkedDecoderTests: XCTestCase {

    func testDecodesChunksAndStopsAtTheEnd() throws {
        let text = "5\r\nhello\r\n1;a=b\r\n \r\nA\r\n0123456789\r\n0\r\n\r\nNEXT"
        let result = try decodeChunked(text)
        XCTAssertEqual(result.body, "hello 0123456789")
        XCTAssertTrue(result.complete)
        XCTAssertEqual(result.consumed, text.utf8.count - 4, "bytes after the body belong to the next message")
    }

    func testChunkExtensionsAreAcceptedAndDropped() throws {
        XCTAssertEqual(try decodeChunked("5;foo=bar\r\nhello\r\n0\r\n\r\n").body, "hello")
        XCTAssertEqual(try decodeChunked("5 ; foo=\"q s\";bar\r\nhello\r\n0;last\r\n\r\n").body, "hello")
        XCTAssertEqual(chunkedError("5;a\u{0}b\r\nhello\r\n0\r\n\r\n"), .invalidChunkExtension)
        let long = "5;" + String(repeating: "x", count: 5000) + "\r\nhello\r\n0\r\n\r\n"
        XCTAssertEqual(chunkedError(long), .chunkExtensionTooLong)
    }

    func testMalformedSizesAreRefused() {
        for bad in ["0x5\r\nhello\r\n0\r\n\r\n", " 5\r\nhello\r\n0\r\n\r\n", "+5\r\nhello\r\n", "-5\r\n", "\r\nhello\r\n", "5 \r\nhello\r\n",
                    "5\t\r\nhello\r\n", "g\r\n", "5x\r\nhello\r\n", "5\r\r\nhello\r\n"] {
            let error = chunkedError(bad)
            XCTAssertTrue(error == .invalidChunkSize || error == .bareCR, "\(bad.debugDescription): \(String(describing: error))")
            XCTAssertEqual(error?.requestStatus, 400)
        }
    }

    func testOverflowingSizeIsAnErrorNotAWrap() throws {
        XCTAssertEqual(chunkedError("10000000000000000\r\n"), .chunkSizeTooLarge)
        XCTAssertEqual(chunkedError("FFFFFFFFFFFFFFFFFFFF\r\n"), .chunkSizeTooLarge)
        // The largest representable size is accepted as a size (the body limit is the caller's business).
        var decoder = ChunkedDecoder()
        let bytes = Array("7FFFFFFFFFFFFFFF\r\nab".utf8)
        var got = 0
        _ = try bytes.withUnsafeBytes { try decoder.decode($0) { got += $0.count } }
        XCTAssertEqual(got, 2)
        XCTAssertEqual(decoder.remainingInChunk, Int.max - 2)
    }

    func testDataMustBeFollowedByCRLF() {
        XCTAssertEqual(chunkedError("3\r\nabcd\r\n0\r\n\r\n"), .missingCRLFAfterChunkData)
        XCTAssertEqual(chunkedError("3\r\nabc\rX"), .missingCRLFAfterChunkData)
    }

    func testTrailersAreCheckedAndDropped() throws {
        XCTAssertEqual(try decodeChunked("3\r\nabc\r\n0\r\nX-Sum: 1\r\nX-B: 2\r\n\r\n").body, "abc")
        XCTAssertTrue(try decodeChunked("3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n").complete)
        XCTAssertEqual(chunkedError("0\r\nBad Name: 1\r\n\r\n"), .invalidTrailer)
        XCTAssertEqual(chunkedError("0\r\nX: a\u{0}\r\n\r\n"), .invalidTrailer)
        XCTAssertEqual(chunkedError("0\r\n: a\r\n\r\n"), .invalidTrailer)
        XCTAssertEqual(chunkedError("0\r\nX: " + String(repeating: "a", count: 20_000) + "\r\n\r\n"), .trailerTooLarge)
    }

    func testBareLFFollowsTheLimits() throws {
        XCTAssertEqual(try decodeChunked("3\nabc\n0\n\n").body, "abc")
        var strict = ChunkedDecoder(limits: HTTPWireLimits(allowBareLF: false))
        let bytes = Array("3\nabc\n0\n\n".utf8)
        XCTAssertThrowsError(try bytes.withUnsafeBytes { try strict.decode($0) { _ in } })
    }

    /// The same body split at every position gives the same data: state carries across calls.
    func testSplitAtEveryByte() throws {
        let text = Array("4;x=y\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nT: v\r\n\r\n".utf8)
        for split in 0...text.count {
            var decoder = ChunkedDecoder()
            var body: [UInt8] = []
            var consumed = 0
            try text[0..<split].withUnsafeBytes { consumed += try decoder.decode($0) { body.append(contentsOf: $0) } }
            try text[split...].withUnsafeBytes { consumed += try decoder.decode($0) { body.append(contentsOf: $0) } }
            XCTAssertEqual(String(decoding: body, as: UTF8.self), "Wikipedia in\r\n\r\nchunks.", "split at \(split)")
            XCTAssertTrue(decoder.isComplete)
            XCTAssertEqual(consumed, text.count)
        }
    }
}
