import Foundation
import XCTest

/// Chunked framing and lengths at the edge (issue 14 items 11 and 12), through the whole relay on its
/// default engine: extensions are valid and dropped, malformed sizes and lengths are refused at once.
final class ChunkedFramingTests: RelayTestCase {
    private func raw(_ relay: TokenRelayProcess, _ text: String, timeout: Double = 5) throws -> String {
        String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(text.utf8), timeout: timeout), as: UTF8.self)
    }

    func testChunkExtensionsInARequestAreAcceptedAndDropped() throws {
        let relay = try startRelay()
        let request = "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + "5;name=value\r\nhello\r\n6;a;b=\"q\"\r\n world\r\n0;last\r\n\r\n"
        XCTAssertTrue(try raw(relay, request).hasPrefix("HTTP/1.1 200"))
        let forwarded = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(String(decoding: forwarded.body, as: UTF8.self), "hello world")
        XCTAssertEqual(forwarded.header("Content-Length"), "11", "re-framed with an exact length, extensions gone")
    }

    func testMalformedChunkSizesAre400AndNeverForwarded() throws {
        let relay = try startRelay()
        for size in ["0x5", " 5", "+5", "5 ", "-5", "ffffffffffffffffff"] {
            let started = Date()
            let request = "POST /bad HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\(size)\r\nhello\r\n0\r\n\r\n"
            let answer = try raw(relay, request)
            XCTAssertTrue(answer.hasPrefix("HTTP/1.1 400"), "\(size): \(answer.prefix(60))")
            XCTAssertLessThan(Date().timeIntervalSince(started), 3, "\(size): answered at once")
        }
        XCTAssertFalse(api.requests.contains { $0.target == "/bad" })
    }

    func testAnOverflowingContentLengthIsAnswered400AtOnceEvenWithExpect() throws {
        let relay = try startRelay()
        let started = Date()
        let answer = try raw(relay, "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\nExpect: 100-continue\r\n\r\n")
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 400"), String(answer.prefix(80)))
        XCTAssertLessThan(Date().timeIntervalSince(started), 3)
        XCTAssertFalse(api.requests.contains { $0.target == "/big" })
    }

    func testChunkExtensionsInAResponseAreRelayedAsTheBody() throws {
        let upstream = try rawUpstream { connection in
            while try connection.readRequest() != nil {
                try connection.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n3\r\ndef\r\n0;end\r\n\r\n")
            }
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL]])
        let response = try get(relay, "/chunked")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, "abcdef")
    }
}
