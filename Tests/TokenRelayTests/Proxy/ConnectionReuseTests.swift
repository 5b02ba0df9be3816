import Foundation
import XCTest

/// The keep-alive race: the upstream closes an idle connection just as tokenrelay sends the next request
/// on it. Idempotent requests are retried once on a fresh connection; a POST is not (it may have been
/// processed), and the client gets a 502.
final class ConnectionReuseTests: RelayTestCase {
    private let seen = Locked<[RecordedRequest]>([])

    /// The first connection answers one request with keep-alive, then reads the next request and closes
    /// without a word; every later connection answers normally.
    private func startRelayWithRacingUpstream() throws -> TokenRelayProcess {
        let seen = self.seen
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                let count = seen.withLock { $0.append(request); return $0.filter { $0.connectionID == connection.id }.count }
                if connection.id == 1 && count == 2 { return }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        return try startRelay(["upstream": ["url": upstream.baseURL]])
    }

    func testIdempotentRequestIsRetriedOnAFreshConnection() throws {
        let relay = try startRelayWithRacingUpstream()
        XCTAssertEqual(try get(relay, "/first").status, 200)
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "PUT", path: "/second", body: Data("v".utf8))
        XCTAssertEqual(response.status, 200, response.bodyText)
        let attempts = seen.withLock { $0 }.filter { $0.path == "/second" }
        XCTAssertEqual(attempts.map(\.connectionID), [1, 2], "sent on the stale connection, then once on a new one")
        XCTAssertTrue(relay.stderrText.contains("retrying on a fresh upstream connection"))
    }

    func testPostIsNotRetriedAfterItWasSent() throws {
        let relay = try startRelayWithRacingUpstream()
        XCTAssertEqual(try get(relay, "/first").status, 200)
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "POST", path: "/order", body: Data("buy".utf8))
        XCTAssertEqual(response.status, 502, response.bodyText)
        XCTAssertEqual(seen.withLock { $0 }.filter { $0.path == "/order" }.count, 1, "a POST that may have been processed is never sent twice")
    }
}
