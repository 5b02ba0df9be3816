import Foundation
import XCTest

/// A hostile or broken upstream answers one request with more bytes than its response: a second,
/// forged response in the same write, or a body on a 304. A keep-alive connection with such leftovers
/// must never carry the next client's request, or that client receives the forged response.
final class UpstreamDesyncTests: RelayTestCase {
    private static let forged = "HTTP/1.1 200 OK\r\nSet-Cookie: session=attacker\r\nContent-Length: 6\r\n\r\nforged"

    /// The first response on the first connection carries `firstResponse` followed by a forged
    /// response; every other response is honest and names the path it answers.
    private func startRelay(firstResponse: String) throws -> TokenRelayProcess {
        let upstream = try rawUpstream { connection in
            var answered = 0
            while let request = try connection.readRequest() {
                answered += 1
                if connection.id == 1 && answered == 1 {
                    try connection.write(firstResponse + Self.forged)
                } else {
                    let body = "real \(request.path)"
                    try connection.write("HTTP/1.1 200 OK\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)")
                }
            }
        }
        return try startRelay(["upstream": ["url": upstream.baseURL]])
    }

    func testExtraResponseAfterACompleteResponseNeverReachesTheNextClient() throws {
        let relay = try startRelay(firstResponse: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
        XCTAssertEqual(try get(relay, "/one").bodyText, "first")
        try assertNextClientGetsItsOwnResponse(relay)
    }

    func testBodyOnA304IsNotReadAsTheNextResponse() throws {
        let relay = try startRelay(firstResponse: "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n")
        XCTAssertEqual(try get(relay, "/one").status, 304)
        try assertNextClientGetsItsOwnResponse(relay)
    }

    private func assertNextClientGetsItsOwnResponse(_ relay: TokenRelayProcess, file: StaticString = #filePath, line: UInt = #line) throws {
        for index in 0..<3 {
            let response = try get(relay, "/next/\(index)")
            XCTAssertEqual(response.status, 200, file: file, line: line)
            XCTAssertEqual(response.bodyText, "real /next/\(index)", "a response meant for nobody reached a client", file: file, line: line)
            XCTAssertNil(response.header("Set-Cookie"), file: file, line: line)
        }
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("upstream sent more data than its response") }, file: file, line: line)
    }
}

/// A response whose framing two parsers could read differently is never relayed as is: the client gets
/// a 502 naming the cause, and the connection is not reused.
final class AmbiguousResponseFramingTests: RelayTestCase {
    private func startRelay(answering head: String) throws -> TokenRelayProcess {
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                if request.path == "/ambiguous" {
                    try connection.write(head)
                } else {
                    try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                }
            }
        }
        return try startRelay(["upstream": ["url": upstream.baseURL]])
    }

    func testTwoDifferentContentLengthsAre502() throws {
        let relay = try startRelay(answering: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\nhello")
        try assertRefused(relay, cause: "conflicting Content-Length values")
    }

    /// evhttp (Debian's 2.1.12) refuses this one itself, before tokenrelay sees the headers.
    func testContentLengthWithChunkedIs502() throws {
        let relay = try startRelay(answering: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        try assertRefused(relay, cause: "invalid HTTP response")
    }

    private func assertRefused(_ relay: TokenRelayProcess, cause: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let response = try get(relay, "/ambiguous")
        XCTAssertEqual(response.status, 502, response.bodyText, file: file, line: line)
        XCTAssertTrue(response.bodyText.contains(cause), response.bodyText, file: file, line: line)
        XCTAssertEqual(try get(relay, "/after").bodyText, "ok", file: file, line: line)
    }
}
