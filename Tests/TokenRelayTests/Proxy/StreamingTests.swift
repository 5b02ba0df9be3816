import Foundation
import XCTest

/// Responses are relayed as they arrive, with backpressure, and both ends going away mid-stream are
/// handled: the client sees a truncated response, the upstream sees its request cancelled.
final class StreamingTests: RelayTestCase {

    private func startRelay(upstream handler: @escaping RawUpstream.Handler) throws -> TokenRelayProcess {
        let upstream = try rawUpstream(handler)
        return try startRelay(["upstream": ["url": upstream.baseURL]])
    }

    private func activeRequests(_ relay: TokenRelayProcess) -> Int? {
        (try? admin(relay, "/status"))?.json()?["active_requests"] as? Int
    }

    func testSlowClientDownloading100MiBDoesNotGrowMemory() throws {
        let total = 100 * 1024 * 1024
        let relay = try startRelay { connection in
            while let request = try connection.readRequest() {
                guard request.path == "/big" else {
                    try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: \(total)\r\n\r\n")
                let block = Data((0..<(1024 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
                for _ in 0..<(total / block.count) { try connection.write(block) }
            }
        }
        XCTAssertEqual(try get(relay, "/warm").status, 200)
        let idle = try XCTUnwrap(residentKiB(pid: relay.pid))
        let client = try StreamingClient(port: relay.proxyPort, timeout: 30, receiveBuffer: 64 * 1024)
        try client.get("/big", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        var received = 0, peak = idle, reads = 0
        while received < total {
            let n = try client.readRaw(upTo: 64 * 1024)
            guard n > 0 else { break }
            received += n
            reads += 1
            // The reader is slower than the upstream: without backpressure the relay would buffer the
            // difference, which over 100 MiB is most of the body.
            usleep(1000)
            if reads % 32 == 0, let rss = residentKiB(pid: relay.pid) { peak = max(peak, rss) }
        }
        XCTAssertEqual(received, total)
        print("slow client: idle RSS \(idle) KiB, peak \(peak) KiB during a 100 MiB download")
        XCTAssertLessThan(peak - idle, 8 * 1024, "RSS grew from \(idle) KiB to \(peak) KiB")
    }

    func testServerSentEventsAreRelayedAsTheyArrive() throws {
        let secondEventMayGo = TestSignal()
        let relay = try startRelay { connection in
            guard try connection.readRequest() != nil else { return }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            try connection.writeChunk("data: one\n\n")
            guard secondEventMayGo.wait(timeout: 10) else { return }
            try connection.writeChunk("data: two\n\n")
            try connection.write("0\r\n\r\n")
        }
        let client = try StreamingClient(port: relay.proxyPort)
        try client.get("/events", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        // The upstream is blocked until we say so: this chunk can only have come through unbuffered.
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "data: one\n\n")
        secondEventMayGo.fire()
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "data: two\n\n")
        XCTAssertNil(try client.readChunk())
    }

    func testUpstreamDyingMidBodyGivesATruncatedResponse() throws {
        let relay = try startRelay { connection in
            guard let request = try connection.readRequest() else { return }
            if request.path == "/length" {
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + String(repeating: "x", count: 100))
            } else {
                try connection.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                try connection.writeChunk("first piece")
            }
            connection.resetOnClose()
        }
        for path in ["/length", "/chunked"] {
            XCTAssertThrowsError(try get(relay, path), "\(path): a cut-off upstream must not look like a complete response") { error in
                XCTAssertTrue("\(error)".contains("closed"), "\(path): \(error)")
            }
        }
        XCTAssertTrue(waitUntil(timeout: 5) { activeRequests(relay) == 0 })
    }

    func testClientDisconnectMidStreamCancelsTheUpstreamRequest() throws {
        let upstreamSawClose = TestSignal()
        let relay = try startRelay { connection in
            guard try connection.readRequest() != nil else { return }
            try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            try connection.writeChunk("data: one\n\n")
            if connection.waitForPeerClose(timeout: 10) { upstreamSawClose.fire() }
        }
        let client = try StreamingClient(port: relay.proxyPort)
        try client.get("/events", port: relay.proxyPort)
        XCTAssertNotNil(try client.readChunk())
        XCTAssertEqual(activeRequests(relay), 1)
        client.close()
        XCTAssertTrue(upstreamSawClose.wait(timeout: 10), "the upstream request must be cancelled when the client goes away")
        XCTAssertTrue(waitUntil(timeout: 5) { activeRequests(relay) == 0 }, "active_requests: \(activeRequests(relay) ?? -1)")
    }

    /// A client that stops reading a large response is disconnected after `timeouts.client_seconds` with
    /// nothing taken (like nginx's send_timeout), and the upstream request is cancelled: a client cannot
    /// hold a connection, an upstream connection and the queued bytes for as long as it likes.
    func testClientThatStopsReadingIsDisconnectedAndTheUpstreamCancelled() throws {
        let upstreamSawClose = TestSignal()
        let upstream = try rawUpstream { connection in
            guard try connection.readRequest() != nil else { return }
            try? connection.write("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 1073741824\r\n\r\n")
            let block = Data(count: 1024 * 1024)
            for _ in 0..<1024 {
                if (try? connection.write(block)) == nil { break }
            }
            if connection.waitForPeerClose(timeout: 10) { upstreamSawClose.fire() }
        }
        let relay = try startRelay(["upstream": ["url": upstream.baseURL], "timeouts": ["client_seconds": 0.5]])
        let client = try StreamingClient(port: relay.proxyPort, timeout: 30, receiveBuffer: 64 * 1024)
        try client.get("/big", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        // From here the client reads nothing.
        XCTAssertTrue(upstreamSawClose.wait(timeout: 15), "the upstream request must be cancelled")
        XCTAssertTrue(waitUntil(timeout: 5) { activeRequests(relay) == 0 }, "active_requests: \(activeRequests(relay) ?? -1)")
        client.close()
    }
}
