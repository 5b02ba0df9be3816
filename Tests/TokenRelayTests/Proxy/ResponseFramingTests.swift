import Foundation
import XCTest

/// Response framing towards clients of both HTTP versions, with upstream responses MiniHTTPServer
/// cannot produce (chunked, close-delimited).
final class ResponseFramingTests: RelayTestCase {

    /// Answers every request with a chunked body of three pieces.
    private func startChunkedUpstream() throws -> RawUpstream {
        let upstream = try rawUpstream { connection in
            while try connection.readRequest() != nil {
                try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
                for piece in ["alpha-", "beta-", "gamma"] { try connection.writeChunk(piece) }
                try connection.write("0\r\n\r\n")
            }
        }
        return upstream
    }

    func testHTTP10ClientGetsAChunkedUpstreamResponseCloseDelimited() throws {
        let upstream = try startChunkedUpstream()
        let relay = try startRelay(["upstream": ["url": upstream.baseURL]])
        for connectionHeader in ["keep-alive", "close"] {
            let raw = try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(
                "GET /c HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: \(connectionHeader)\r\n\r\n".utf8))
            let text = String(decoding: raw, as: UTF8.self)
            let parts = text.components(separatedBy: "\r\n\r\n")
            XCTAssertTrue(text.hasPrefix("HTTP/1.1 200") || text.hasPrefix("HTTP/1.0 200"), text)
            XCTAssertFalse(parts[0].lowercased().contains("transfer-encoding"), "no chunked framing for HTTP/1.0: \(parts[0])")
            XCTAssertFalse(parts[0].lowercased().contains("content-length: 0"), parts[0])
            XCTAssertEqual(parts.dropFirst().joined(separator: "\r\n\r\n"), "alpha-beta-gamma", "body delimited by the close")
        }
    }

    func testHTTP11ClientGetsTheChunkedResponseDecodedIntact() throws {
        let upstream = try startChunkedUpstream()
        let relay = try startRelay(["upstream": ["url": upstream.baseURL]])
        let response = try get(relay, "/c")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.bodyText, "alpha-beta-gamma")
        XCTAssertEqual(response.header("Content-Type"), "text/plain")
    }

    /// A HEAD answer announcing its would-be length as a list of equal values (`10, 10`, which RFC 9110
    /// lets a recipient read as 10) keeps announcing it to the client.
    func testHeadResponseWithARepeatedLengthKeepsItsLength() throws {
        let upstream = try rawUpstream { connection in
            while try connection.readRequest() != nil {
                try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10, 10\r\n\r\n")
            }
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL]])
        let raw = try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data("HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8))
        let head = String(decoding: raw, as: UTF8.self).lowercased()
        XCTAssertTrue(head.hasPrefix("http/1.1 200"), head)
        XCTAssertTrue(head.contains("content-length: 10\r\n"), head)
        XCTAssertTrue(head.hasSuffix("\r\n\r\n"), "no body after a HEAD answer: \(head)")
    }
}
