import Foundation
import XCTest

/// Each configurable timeout fires (and the header timeout does not cut a quiet stream). The hold
/// timeout is covered in RefreshFailureTests, the plain header timeout in ProxyPathTests.
final class TimeoutTests: RelayTestCase {

    func testConnectTimeoutGives504LongBeforeTheResponseTimeout() throws {
        // A listener that never accepts, with its one-slot queue taken: further connects hang in SYN-SENT.
        let blackHole = try rawUpstream(backlog: 0, accepting: false) { _ in }
        let filler = try LoopbackSocket.connect(port: blackHole.port, timeout: 2)
        defer { close(filler) }
        let relay = try startRelay(["upstream": ["url": blackHole.baseURL], "timeouts": ["connect_seconds": 0.5, "upstream_seconds": 30]])
        let started = Date()
        let response = try get(relay)
        let elapsed = Date().timeIntervalSince(started)
        XCTAssertEqual(response.status, 504, response.bodyText)
        XCTAssertGreaterThanOrEqual(elapsed, 0.4)
        XCTAssertLessThan(elapsed, 5, "the connect timeout, not the 30 s response timeout, must end the request")
        XCTAssertTrue(relay.stderrText.contains("could not connect in time"), relay.stderrText)
    }

    func testIdleEventStreamOutlivesTheHeaderTimeout() throws {
        let neverFired = TestSignal()
        let upstream = try rawUpstream { connection in
            guard try connection.readRequest() != nil else { return }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            try connection.writeChunk("data: one\n\n")
            neverFired.wait(timeout: 1.5) // silence: three times the header timeout
            try connection.writeChunk("data: two\n\n")
            try connection.write("0\r\n\r\n")
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL],
                                    "timeouts": ["upstream_seconds": 0.5, "stream_idle_seconds": 10]])
        let client = try StreamingClient(port: relay.proxyPort)
        try client.get("/events", port: relay.proxyPort)
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "data: one\n\n")
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "data: two\n\n")
        XCTAssertNil(try client.readChunk())
    }

    func testStreamIdleTimeoutCutsASilentStream() throws {
        let upstream = try rawUpstream { connection in
            guard try connection.readRequest() != nil else { return }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            try connection.writeChunk("data: one\n\n")
            _ = connection.waitForPeerClose(timeout: 10)
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL], "timeouts": ["stream_idle_seconds": 0.5]])
        let client = try StreamingClient(port: relay.proxyPort)
        try client.get("/events", port: relay.proxyPort)
        XCTAssertNotNil(try client.readChunk())
        let started = Date()
        XCTAssertThrowsError(try client.readChunk(), "a stream cut by the idle timeout must look truncated")
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
    }

    func testIdlePooledUpstreamConnectionIsClosed() throws {
        let relay = try startRelay(["timeouts": ["pool_idle_seconds": 0.3]])
        XCTAssertEqual(try get(relay).status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { api.openConnections == 0 }, "open upstream connections: \(api.openConnections)")
        XCTAssertEqual(try get(relay).status, 200, "the pool reconnects after closing an idle connection")
    }

    func testIdleClientConnectionIsClosed() throws {
        let relay = try startRelay(["timeouts": ["client_seconds": 0.5]])
        let client = try StreamingClient(port: relay.proxyPort)
        try client.get("/resource", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        let started = Date()
        while try client.readRaw(upTo: 64 * 1024) > 0 {} // the body, then the close
        let elapsed = Date().timeIntervalSince(started)
        XCTAssertGreaterThanOrEqual(elapsed, 0.3)
        XCTAssertLessThan(elapsed, 5)
    }
}
