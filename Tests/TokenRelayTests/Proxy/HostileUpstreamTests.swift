import Foundation
import XCTest

/// Upstream responses a broken or hostile upstream can send, each answered so that the client neither
/// hangs nor receives something that is not a complete, honest response.
final class HostileUpstreamTests: RelayTestCase {
    /// Answers `/bad` with `bad` (raw bytes, then keeps the connection open unless `close`), anything
    /// else with a plain 200.
    private func startRelay(bad: @escaping @Sendable (RawUpstreamConnection) throws -> Void,
                            overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        let upstream = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                if request.path == "/bad" { return try bad(connection) }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        var config = overrides
        var upstreamConfig = config["upstream"] as? [String: Any] ?? [:]
        upstreamConfig["url"] = upstream.baseURL
        config["upstream"] = upstreamConfig
        return try startRelay(config)
    }

    private func assertBadGateway(_ relay: TokenRelayProcess, mentioning text: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/bad", timeout: 10)
        XCTAssertEqual(response.status, 502, response.bodyText, file: file, line: line)
        XCTAssertTrue(response.bodyText.contains(text), response.bodyText, file: file, line: line)
        XCTAssertEqual(try get(relay, "/after").bodyText, "ok", file: file, line: line)
    }

    func testEarlyHintsAreNotRelayedAsTheFinalResponse() throws {
        let relay = try startRelay(bad: { connection in
            try connection.write("HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            _ = connection.waitForPeerClose(timeout: 10)
        })
        // The interim response is read past and the final one relayed: the 103 never reaches the client as
        // the answer.
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/bad", timeout: 10)
        XCTAssertEqual(response.status, 200, response.bodyText)
        XCTAssertEqual(response.bodyText, "ok")
    }

    func testUnaskedSwitchingProtocolsIsRefused() throws {
        let relay = try startRelay(bad: { connection in
            try connection.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            _ = connection.waitForPeerClose(timeout: 10)
        })
        try assertBadGateway(relay, mentioning: "interim 101")
    }

    func testAStatusThatIsNotThreeDigitsIsRefused() throws {
        let relay = try startRelay(bad: { connection in
            try connection.write("HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok")
        })
        try assertBadGateway(relay, mentioning: "status code")
    }

    func testAResponseHeadDrippingByteByByteTimesOut() throws {
        let relay = try startRelay(bad: { connection in
            for byte in "HTTP/1.1 200 OK\r\nX-Slow: abcdefghijklmnopqrstuvwxyz\r\n".utf8 {
                try connection.write(Data([byte]))
                Thread.sleep(forTimeInterval: 0.1)  // the upstream's pacing: 5 s for the head
            }
        }, overrides: ["timeouts": ["upstream_seconds": 1]])
        let started = Date()
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/bad", timeout: 10)
        XCTAssertEqual(response.status, 504)
        XCTAssertLessThan(Date().timeIntervalSince(started), 3, "the head as a whole is bounded by upstream_seconds")
    }

    func testAHugeResponseHeadIsRefused() throws {
        let relay = try startRelay(bad: { connection in
            let field = "X-Big: " + String(repeating: "b", count: 1000) + "\r\n"
            try connection.write("HTTP/1.1 200 OK\r\n" + String(repeating: field, count: 400) + "Content-Length: 2\r\n\r\nok")
            _ = connection.waitForPeerClose(timeout: 10)
        })
        // evhttp reports a head over its limit as an invalid header.
        try assertBadGateway(relay, mentioning: "invalid HTTP response")
    }

    func testEqualDuplicateLengthsGoOutOnce() throws {
        let relay = try startRelay(bad: { connection in
            try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok")
        })
        let response = try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/bad")
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.headers(named: "Content-Length"), ["2"])
    }

    func testAResponseCutShortAfterItsHeadReachesTheClientCutShort() throws {
        let relay = try startRelay(bad: { connection in
            try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
            connection.resetOnClose()
        })
        let raw = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data("GET /bad HTTP/1.1\r\nHost: x\r\n\r\n".utf8)),
                         as: UTF8.self)
        XCTAssertTrue(raw.hasPrefix("HTTP/1.1 200"), "the head went out before the cut: \(raw.prefix(200))")
        XCTAssertTrue(raw.hasSuffix("short"), String(raw.suffix(50)))
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("upstream request failed") }, relay.stderrText)
    }
}
