import Foundation
@testable import HTTPTransport
import XCTest

/// Issue 26: a client connection that has sent nothing holds only what it needs to be woken (its read
/// event and idle timer); the head timer comes with the first byte of a head, the request scratch
/// (parser, parsed head, decoder, response-head buffer) with the first byte, and the write event the
/// first time output has to wait. Made late, each must still do its job.
final class IdleConnectionMemoryTests: XCTestCase {

    /// Waits (bounded) until the server has accepted `count` connections.
    private func waitForConnections(_ server: TransportTestServer, _ count: Int) {
        let deadline = Date().addingTimeInterval(5)
        while server.sync({ $0.connections.count }) < count && Date() < deadline { usleep(1000) }
        XCTAssertEqual(server.sync { $0.connections.count }, count)
    }

    private func holdings(_ server: TransportTestServer) -> [(headTimer: Bool, writeEvent: Bool, scratch: Bool)] {
        server.sync { $0.connections.values.map { ($0.holdsHeadTimer, $0.stream.holdsWriteEvent, $0.holdsRequestScratch) } }
    }

    func testSilentConnectionHoldsNeitherHeadTimerNorWriteEventAndIsServedLater() throws {
        let server = try TransportTestServer(headTimeout: 5)
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        waitForConnections(server, 1)
        XCTAssertTrue(holdings(server).allSatisfy { !$0.headTimer && !$0.writeEvent && !$0.scratch })
        try client.send("GET /echo?first HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "GET /echo?first\n")
        XCTAssertTrue(holdings(server).allSatisfy { !$0.headTimer }, "a head that came whole in one read never needed it")
        XCTAssertTrue(holdings(server).allSatisfy { $0.scratch }, "kept after the first request, for the next")
        try client.send("GET /echo?second HTTP/1.1\r\n")
        let deadline = Date().addingTimeInterval(5)
        while !holdings(server).allSatisfy({ $0.headTimer }) && Date() < deadline { usleep(1000) }
        XCTAssertTrue(holdings(server).allSatisfy { $0.headTimer }, "made by the first part of a head")
        try client.send("Host: h\r\n\r\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "GET /echo?second\n")
    }

    /// The head timer made with the first byte still bounds a head that never ends.
    func testHeadTimerMadeByTheFirstByteAnswers408() throws {
        let server = try TransportTestServer(headTimeout: 0.3)
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        waitForConnections(server, 1)
        XCTAssertFalse(holdings(server)[0].headTimer)
        try client.send("GET /never-ends HTTP/1.1\r\nHost: h\r\n")
        XCTAssertEqual(try client.readResponse().status, 408)
        XCTAssertEqual(server.lastEnd(), .headTimeout)
    }

    /// A response the socket cannot take at once makes the write event then, and arrives whole; the
    /// connection then serves its next request.
    func testWriteEventMadeWhenOutputFirstWaits() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let client = try LoopbackClient(port: server.port)
        let size = 16 << 20
        try client.send("GET /known?\(size) HTTP/1.1\r\nHost: h\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 200)
        XCTAssertTrue(response.body == expectedPattern(size))
        XCTAssertTrue(holdings(server).allSatisfy { $0.writeEvent }, "16 MiB cannot all be taken by the first writes")
        try client.send("GET /echo?again HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "GET /echo?again\n")
    }
}
