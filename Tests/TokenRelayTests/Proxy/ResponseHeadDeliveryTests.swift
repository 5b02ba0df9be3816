import Foundation
import XCTest

/// A response head reaches the client when it arrives, not when its body starts. Found by the black-box
/// probe: the head waited for the first body piece (to go out in one write with it), so an event stream
/// that sends its head and then nothing until the first event, or a download whose body is slow to start,
/// showed the client nothing at all; clients with a response-header timeout gave up on a healthy stream.
final class ResponseHeadDeliveryTests: RelayTestCase {
    /// The upstream sends `head`, then waits (bounded) until the test says the client has it, then `body`.
    private func startRelay(head: String, body: String, clientHasHead: DispatchSemaphore) throws -> TokenRelayProcess {
        let upstream = try rawUpstream { connection in
            guard try connection.readRequest() != nil else { return }
            try connection.write(head)
            _ = clientHasHead.wait(timeout: .now() + 10)
            try connection.write(body)
            _ = connection.waitForPeerClose(timeout: 10)
        }
        return try startRelay(["upstream": ["url": upstream.baseURL]])
    }

    func testAnEventStreamHeadArrivesBeforeItsFirstEvent() throws {
        let clientHasHead = DispatchSemaphore(value: 0)
        defer { clientHasHead.signal() }
        let relay = try startRelay(head: "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                                   body: "d\r\ndata: first\n\n\r\n0\r\n\r\n", clientHasHead: clientHasHead)
        let client = try StreamingClient(port: relay.proxyPort, timeout: 5)
        defer { client.close() }
        try client.get("/events", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        clientHasHead.signal()
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "data: first\n\n")
    }

    func testAHeadOfKnownLengthArrivesBeforeItsBody() throws {
        let clientHasHead = DispatchSemaphore(value: 0)
        defer { clientHasHead.signal() }
        let relay = try startRelay(head: "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", body: "late", clientHasHead: clientHasHead)
        let client = try StreamingClient(port: relay.proxyPort, timeout: 5)
        defer { client.close() }
        try client.get("/download", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        clientHasHead.signal()
        var received = 0
        while received < 4 {
            let n = try client.readRaw(upTo: 4 - received)
            guard n > 0 else { break }
            received += n
        }
        XCTAssertEqual(received, 4)
    }
}
