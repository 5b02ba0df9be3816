import Foundation
import XCTest

/// The admin listener's HTTP behaviour on the transport: keep-alive and pipelined probes answered in
/// order, HEAD without a body, the query ignored for routing, and its small limits.
final class AdminListenerTests: RelayTestCase {

    func testPipelinedProbesAreAnsweredInOrderOnOneConnection() throws {
        let relay = try startRelay()
        let connection = try HTTPTestConnection(port: relay.adminPort)
        defer { connection.close() }
        try connection.write(method: "GET", path: "/healthz")
        try connection.write(method: "HEAD", path: "/readyz")
        try connection.write(method: "GET", path: "/status?verbose=1")
        try connection.write(method: "DELETE", path: "/metrics")
        try connection.write(method: "GET", path: "/nothing-here")
        let health = try connection.readResponse()
        XCTAssertEqual(health.status, 200)
        XCTAssertEqual(health.header("Cache-Control"), "no-store")
        XCTAssertEqual(health.header("Content-Type"), "application/json")
        XCTAssertTrue(health.bodyText.contains("alive"))
        let ready = try connection.readResponse(requestMethod: "HEAD")
        XCTAssertEqual(ready.status, 200)
        XCTAssertTrue(ready.body.isEmpty, "HEAD gets the head only")
        XCTAssertNotNil(ready.header("Content-Length"))
        let status = try connection.readResponse()
        XCTAssertEqual(status.status, 200, "the query does not change the route")
        XCTAssertNotNil(status.json()?["generation"])
        XCTAssertEqual(try connection.readResponse().status, 405)
        XCTAssertEqual(try connection.readResponse().status, 404)
    }

    func testOversizedBodyAndHeadAreRefused() throws {
        let relay = try startRelay()
        let bigBody = try HTTPTestClient.send(port: relay.adminPort, method: "POST", path: "/refresh", body: Data(repeating: 0x61, count: 4096))
        XCTAssertEqual(bigBody.status, 413, "admin bodies are at most 1 KiB")
        let bigHead = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/healthz",
                                              headers: [("X-Padding", String(repeating: "p", count: 20_000))])
        XCTAssertGreaterThanOrEqual(bigHead.status, 400, "admin heads are at most 16 KiB")
        XCTAssertEqual(try admin(relay, "/healthz").status, 200, "and the listener serves on")
    }
}
