import Foundation
import XCTest

/// The admin listener has 32 connection slots. Connections that each send part of a request head and
/// then nothing (or a byte now and then, within the 30 s head limit) used to hold every slot, and the
/// waiting ones beyond it, so `/readyz` went unanswered for as long as the flood lasted: a probe failure
/// restarts a healthy relay. At the limit, a head still incomplete a second after it began is answered
/// 408 and its connection closed to make room, on the admin port as on the proxied one.
final class AdminSlowHeadFloodTests: RelayTestCase {
    func testProbesAreAnsweredDuringASlowHeadFlood() throws {
        let relay = try startRelay()
        // More than the 32 slots plus the 16 that may wait: the rest sit in the listen backlog.
        var flood: [HTTPTestConnection] = []
        defer { for connection in flood { connection.close() } }
        for _ in 0..<64 {
            let connection = try HTTPTestConnection(port: relay.adminPort, timeout: 2)
            try? connection.writeRaw("GET /status HTTP/1.1\r\nHost: x\r\n")
            flood.append(connection)
        }

        // Each probe has 2 s; the flood's heads would hold their slots for 30 s without the rule.
        let deadline = Date(timeIntervalSinceNow: 12)
        var answered: Int?
        while answered == nil && Date() < deadline {
            answered = try? HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/readyz", timeout: 2).status
        }
        XCTAssertEqual(answered, 200, "/readyz answered while slow heads flood the admin port")
        let evicted = flood.filter { $0.peerClosed || $0.hasBytes }.count
        XCTAssertGreaterThan(evicted, 0, "stalled heads made room")
    }
}
