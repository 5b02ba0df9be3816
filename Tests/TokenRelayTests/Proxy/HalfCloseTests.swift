import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A client may shut down its write side once its request is whole and wait for the answer (a half-close).
/// The proxy used to take that FIN for a client that left and answered nothing.
final class HalfCloseTests: RelayTestCase {
    func testARequestFollowedByAHalfCloseGetsItsAnswer() throws {
        let relay = try startRelay()
        api.responseDelay = 0.3   // the FIN is in well before the answer
        let fd = try LoopbackSocket.connect(port: relay.proxyPort, timeout: 10)
        defer { close(fd) }
        try LoopbackSocket.writeAll(fd, Data("GET /half-closed HTTP/1.1\r\nHost: relay\r\n\r\n".utf8))
        XCTAssertEqual(shutdown(fd, Int32(SHUT_WR)), 0)
        let answer = String(decoding: try SocketReader(fd: fd).readToEOF(), as: UTF8.self)
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 200"), "answer: \(answer.prefix(200))")
        XCTAssertTrue(answer.contains("/half-closed"), "the upstream's answer to this request")
        XCTAssertEqual(api.requestCount, 1)
    }
}
