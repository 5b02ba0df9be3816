import Foundation
import XCTest

/// A spike of requests, released together by a refresh or arriving together: requests admitted to a
/// hold are never refused by the bound on pool waiters, the listener's backlog holds a connection spike,
/// and every 503 tokenrelay makes itself is logged with its reason.
final class LoadSpikeTests: RelayTestCase {
    /// 200 requests held for one refresh, 4 upstream connections, room for only 8 new waiters: all of
    /// them are replayed (the waiter bound is for new arrivals), in order, with one refresh.
    func testHeldRequestsReleasedTogetherAllQueueForConnections() throws {
        let relay = try startRelay(["limits": ["max_upstream_connections": 4, "max_upstream_waiters": 8]])
        XCTAssertEqual(try get(relay, "/warm").status, 200)
        // The refresh stays open long enough for the whole burst to arrive and be held.
        tokenServer.failureMode = .delay(3)
        tokenServer.expireAccessTokens()
        let port = relay.proxyPort
        let first = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: port, method: "GET", path: "/first", timeout: 30) }
        XCTAssertTrue(waitUntil(timeout: 5) { self.tokenServer.receivedRequests.count == 1 }, "the refresh started")
        let results = HTTPTestClient.concurrently(200, timeout: 60) { index in
            try HTTPTestClient.send(port: port, method: "GET", path: "/held/\(index)", timeout: 30).status
        }
        let statuses = results.map { (try? $0.get()) ?? -1 }
        XCTAssertEqual(statuses.filter { $0 != 200 }.count, 0, "not 200: \(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
        XCTAssertEqual(try first.wait(timeout: 30).status, 200)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_hold_duration_seconds_count{outcome=\"replayed\"}"), metrics)
    }

    /// 1000 concurrent requests right after expiry, default limits, loopback: all served, one refresh.
    func testThousandWaySpikeAfterExpiryWithDefaultLimits() throws {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        try XCTSkipIf(limit.rlim_cur < 4096, "the test process may open only \(limit.rlim_cur) files; 1000 clients need more")
        let relay = try startRelay()
        XCTAssertEqual(try get(relay, "/warm").status, 200)
        tokenServer.expireAccessTokens()
        let port = relay.proxyPort
        let results = HTTPTestClient.concurrently(1000, timeout: 120) { index in
            try HTTPTestClient.send(port: port, method: "GET", path: "/spike/\(index)", timeout: 60).status
        }
        let statuses = results.map { (try? $0.get()) ?? -1 }
        XCTAssertEqual(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count), [200: 1000])
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    func testEveryLocal503IsLoggedWithItsReason() throws {
        let relay = try startRelay(["refresh": ["max_attempts": 1]])
        tokenServer.failureMode = .unavailable(status: 500)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 503)
        XCTAssertTrue(waitUntil(timeout: 5) { relay.stderrText.contains("request answered by tokenrelay: service unavailable") }, relay.stderrText)
        XCTAssertTrue(relay.stderrText.contains("error=token_unavailable"), relay.stderrText)
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_hold_duration_seconds_count{outcome=\"unavailable\"}"), metrics)
    }

    func testListenBacklogIsConfigurable() throws {
        let relay = try startRelay(["limits": ["listen_backlog": 1000]])
        XCTAssertEqual(try listenBacklog(port: relay.proxyPort), 1000)
        let byDefault = try startRelay()
        let systemMaximum = Int((try? String(contentsOfFile: "/proc/sys/net/core/somaxconn", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 4096
        XCTAssertEqual(try listenBacklog(port: byDefault.proxyPort), min(systemMaximum, 65535))
    }

    /// The backlog of the listening socket on `port`, as `ss` reports it (Send-Q of a LISTEN socket).
    private func listenBacklog(port: Int) throws -> Int? {
        let ss = Process()
        ss.executableURL = URL(fileURLWithPath: "/usr/bin/ss")
        ss.arguments = ["-Hltn", "sport = :\(port)"]
        let pipe = Pipe()
        ss.standardOutput = pipe
        try ss.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        ss.waitUntilExit()
        let fields = output.split(whereSeparator: { $0 == " " || $0 == "\n" })
        return fields.count > 2 ? Int(fields[2]) : nil
    }
}
