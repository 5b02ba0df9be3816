import Foundation
import XCTest

/// `Upgrade: h2c` on HTTP/1.1 is not relayed: after a 101 the connection would be a raw tunnel that no
/// token, base path or refresh rule reaches. The request is answered as the HTTP/1.1 request it also is
/// (RFC 9110 §7.8 lets a server ignore `Upgrade`): the upstream sees neither `Upgrade` nor
/// `HTTP2-Settings`, gets the token, and an upstream that switches anyway is a failure (502), not a tunnel.
final class H2CUpgradeTests: RelayTestCase {
    private var upstream: RawUpstream?

    override func tearDownWithError() throws {
        upstream?.stop()
        try super.tearDownWithError()
    }

    private static let upgradeFields: [(String, String)] = [
        ("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"), ("HTTP2-Settings", "AAMAAABkAAQCAAAAAAIAAAAA"),
    ]

    func testAnH2CUpgradeIsAnsweredAsAnOrdinaryRequestWithTheToken() throws {
        let relay = try startRelay(["data_plane": "transport"])
        let response = try get(relay, "/resource", headers: Self.upgradeFields)
        XCTAssertEqual(response.status, 200, response.bodyText)
        let seen = try XCTUnwrap(api.requests.first)
        XCTAssertNil(seen.header("Upgrade"), "the upgrade is not passed on")
        XCTAssertNil(seen.header("HTTP2-Settings"))
        XCTAssertEqual(seen.header("Authorization"), "Bearer \(tokenServer.currentAccessToken ?? "")")
    }

    /// A WebSocket asked for beside h2c is still relayed as a WebSocket; h2c alone never is.
    func testOnlyTheH2CPartOfAnUpgradeListIsDropped() throws {
        let recorded = Locked<[RecordedRequest]>([])
        let upstream = try RawUpstream { connection in
            while let request = try connection.readRequest() {
                recorded.withLock { $0.append(request) }
                // An upstream that switches whenever it is asked to.
                if let asked = request.header("Upgrade") {
                    try connection.write("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: \(asked)\r\n\r\n")
                    return
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        self.upstream = upstream
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.baseURL]])
        let plain = try get(relay, "/resource", headers: Self.upgradeFields)
        XCTAssertEqual(plain.status, 200, "no tunnel: \(plain.bodyText)")
        XCTAssertEqual(plain.bodyText, "ok")
        let mixed = try HTTPTestConnection(port: relay.proxyPort, timeout: 10)
        try mixed.writeRaw("GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: h2c, websocket\r\n\r\n")
        XCTAssertEqual(try mixed.readResponse().status, 101)
        let requests = recorded.withLock { $0 }
        XCTAssertEqual(requests.count, 2)
        XCTAssertNil(requests.first?.header("Upgrade"))
        XCTAssertNil(requests.first?.header("HTTP2-Settings"))
        XCTAssertEqual(requests.last?.header("Upgrade"), "websocket")
    }

    /// An upstream that answers 101 to a request that did not ask to switch (h2c was dropped) is a
    /// broken upstream: the client gets a 502, never the raw connection.
    func testAnUpstreamThatSwitchesToH2CAnywayIsAFailureNotATunnel() throws {
        let upstream = try RawUpstream { connection in
            guard try connection.readRequest() != nil else { return }
            try connection.write("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
            try connection.write(Data([0, 0, 0, 4, 0, 0, 0, 0, 0]))   // an HTTP/2 SETTINGS frame
        }
        self.upstream = upstream
        let relay = try startRelay(["data_plane": "transport", "upstream": ["url": upstream.baseURL]])
        let response = try get(relay, "/resource", headers: Self.upgradeFields)
        XCTAssertEqual(response.status, 502, response.bodyText)
    }
}
