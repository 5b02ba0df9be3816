import Foundation
import XCTest

/// Two tokenrelay processes sharing one token file (a rolling restart): never a reused refresh token.
final class MultiProcessTests: RelayTestCase {
    override var accessTokenLifetime: Double? { 2 }

    func testTwoProcessesShareOneTokenFileWithoutReuse() throws {
        let first = try startRelay()
        let second = try startRelay()
        let ports = [first.proxyPort, second.proxyPort]
        let deadline = Date().addingTimeInterval(8)
        let results = HTTPTestClient.concurrently(4, timeout: 40) { worker -> [Int: Int] in
            var counts: [Int: Int] = [:]
            var i = 0
            while Date() < deadline {
                let port = ports[worker % 2]
                let status = (try? HTTPTestClient.send(port: port, method: "GET", path: "/shared/\(worker)/\(i)").status) ?? -1
                counts[status, default: 0] += 1
                i += 1
            }
            return counts
        }
        var total: [Int: Int] = [:]
        for case .success(let counts) in results { total.merge(counts, uniquingKeysWith: +) }
        XCTAssertEqual(total.keys.sorted(), [200], "\(total)")
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertFalse(tokenServer.isCurrentFamilyRevoked)

        // One goes away; the other carries on through further rotations.
        XCTAssertEqual(first.stop(), 0)
        let later = Date().addingTimeInterval(4)
        while Date() < later { XCTAssertEqual(try get(second).status, 200) }
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertTrue(second.stderrText.contains("adopted") || first.stderrText.contains("adopted"),
                      "one process must have adopted the other's rotation")
    }
}
