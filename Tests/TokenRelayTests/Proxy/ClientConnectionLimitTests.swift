import Foundation
@testable import TokenRelay
import XCTest

/// `limits.max_client_connections`: idle connections make room, busy ones lead to a 503 that closes,
/// and beyond the over-limit allowance new connections wait in the listen backlog. The count must never
/// drift, or the relay would stop serving, so every test ends with it back at zero.
final class ClientConnectionLimitTests: RelayTestCase {
    private func openConnections(_ relay: TokenRelayProcess) -> Int? {
        (try? admin(relay, "/status"))?.json()?["client_connections"] as? Int
    }

    private func limitActions(_ relay: TokenRelayProcess, _ action: String) -> Int {
        let text = (try? admin(relay, "/metrics"))?.bodyText ?? ""
        let prefix = "tokenrelay_client_connection_limit_total{action=\"\(action)\"} "
        return text.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Int($0.dropFirst(prefix.count)) } ?? 0
    }

    /// Holds requests to /busy until the gate is signalled (bounded, so a failing test cannot hang).
    private func busyGate() -> DispatchSemaphore {
        let gate = DispatchSemaphore(value: 0)
        api.responseOverride = { request in
            if request.path == "/busy" { _ = gate.wait(timeout: .now() + 15) }
            return nil
        }
        return gate
    }

    /// `count` requests to /busy, each on its own connection, in flight at the upstream when this returns.
    private func busyRequests(_ count: Int, on relay: TokenRelayProcess) -> [AsyncCall<TestHTTPResponse>] {
        let port = relay.proxyPort
        let calls = (0..<count).map { _ in HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: port, method: "GET", path: "/busy") } }
        XCTAssertTrue(waitUntil(timeout: 5) { api.requestCount == count })
        return calls
    }

    /// A connection gets its session with its first request head (issue 26): until then it must still
    /// count, and its end, with or without a session, must take it off the count.
    func testSilentConnectionsCountAndLeaveTheCount() throws {
        let relay = try startRelay()
        let silent = try (0..<3).map { _ in try HTTPTestConnection(port: relay.proxyPort) }
        let served = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertEqual(try served.send(method: "GET", path: "/one").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 4 }, "\(String(describing: openConnections(relay)))")
        silent[0].close()
        served.close()
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 2 }, "\(String(describing: openConnections(relay)))")
        XCTAssertEqual(try silent[1].send(method: "GET", path: "/late").status, 200, "a session made late serves")
        silent[1].close()
        silent[2].close()
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 0 }, "\(String(describing: openConnections(relay)))")
    }

    func testIdleKeepAliveConnectionIsClosedToMakeRoom() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 2]])
        let first = try HTTPTestConnection(port: relay.proxyPort)
        let second = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertEqual(try first.send(method: "GET", path: "/one").status, 200)
        XCTAssertEqual(try second.send(method: "GET", path: "/two").status, 200)
        XCTAssertEqual(openConnections(relay), 2)

        // The newcomer waits over the limit; once the grace has passed, the sweep closes the connection
        // idle the longest and gives its slot to the newcomer.
        let third = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertTrue(waitUntil(timeout: 5) { first.peerClosed }, "the connection idle the longest was closed")
        XCTAssertEqual(try third.send(method: "GET", path: "/third").status, 200)
        XCTAssertFalse(second.peerClosed)
        XCTAssertEqual(try second.send(method: "GET", path: "/two-again").status, 200)
        XCTAssertEqual(limitActions(relay, "closed_idle"), 1)
        XCTAssertEqual(limitActions(relay, "refused"), 0)
        second.close()
        third.close()
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 0 }, "count back to zero: \(String(describing: openConnections(relay)))")
    }

    func testBusyConnectionsAtTheLimitMeanA503ThatCloses() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 2]])
        let gate = busyGate()
        let busy = busyRequests(2, on: relay)
        let port = relay.proxyPort

        let refused = try HTTPTestConnection(port: port)
        let answer = try refused.send(method: "GET", path: "/over")
        XCTAssertEqual(answer.status, 503)
        XCTAssertEqual(answer.header("Retry-After"), "1")
        XCTAssertEqual(answer.header("Connection"), "close")
        XCTAssertEqual(answer.json()?["error"] as? String, "overloaded")
        XCTAssertTrue(waitUntil(timeout: 5) { refused.peerClosed }, "the over-limit connection is closed after its answer")
        XCTAssertEqual(limitActions(relay, "refused"), 1)
        XCTAssertFalse(api.requests.contains { $0.path == "/over" }, "a refused request never reaches the upstream")

        gate.signal()
        gate.signal()
        for call in busy { XCTAssertEqual(try call.wait(timeout: 10).status, 200) }
        XCTAssertEqual(try get(relay, "/after").status, 200, "served again once a slot is free")
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 0 })
    }

    func testOverLimitConnectionIsPromotedWhenASlotFrees() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 1]])
        let gate = busyGate()
        let busy = busyRequests(1, on: relay)[0]
        let port = relay.proxyPort
        let waiting = try HTTPTestConnection(port: port)  // over the limit, no request yet
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 2 })

        gate.signal()
        XCTAssertEqual(try busy.wait(timeout: 10).status, 200)  // HTTPTestClient.send closes: the slot frees
        XCTAssertEqual(try waiting.send(method: "GET", path: "/promoted").status, 200)
        XCTAssertEqual(limitActions(relay, "refused"), 0)
        waiting.close()
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 0 })
    }

    /// Past the limit plus its allowance (16 for small limits) the relay stops accepting; the kernel keeps
    /// the newcomer in the listen backlog, and it is answered once connections close: with a 503 while the
    /// only slot is still busy.
    func testBeyondTheAllowanceNewConnectionsWaitInTheBacklog() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 1]])
        let gate = busyGate()
        let busy = busyRequests(1, on: relay)[0]
        let port = relay.proxyPort
        let overLimit = try (0..<16).map { _ in try HTTPTestConnection(port: port) }
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 17 })
        XCTAssertEqual(limitActions(relay, "paused_accepting"), 1)

        let queued = try HTTPTestConnection(port: port)  // the kernel completes the handshake; nobody accepts
        try queued.write(method: "GET", path: "/queued")
        XCTAssertFalse(waitUntil(timeout: 0.3) { queued.peerClosed || queued.hasBytes }, "answered while at the hard bound")
        XCTAssertEqual(openConnections(relay), 17, "not accepted while at the hard bound")

        overLimit.forEach { $0.close() }
        let answer = try queued.readResponse()
        XCTAssertEqual(answer.status, 503, "accepted from the backlog and answered; the one slot is still busy")
        XCTAssertTrue(waitUntil(timeout: 5) { queued.peerClosed })
        gate.signal()
        XCTAssertEqual(try busy.wait(timeout: 10).status, 200)
        XCTAssertEqual(try get(relay, "/retried").status, 200)
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 0 })
    }

    /// Silent connections (a leaky pool, pre-connects) fill the limit and the allowance; once they have
    /// said nothing for the grace, they make way, and a real client is served long before client_seconds.
    func testSilentConnectionsDoNotLockOutAClient() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 2], "timeouts": ["client_seconds": 60]])
        let silent = try (0..<18).map { _ in try HTTPTestConnection(port: relay.proxyPort) }
        XCTAssertTrue(waitUntil(timeout: 5) { limitActions(relay, "paused_accepting") == 1 })
        let started = Date()
        XCTAssertEqual(try get(relay, "/real-client").status, 200)
        XCTAssertLessThan(Date().timeIntervalSince(started), 10, "served after the grace, not after client_seconds")
        XCTAssertGreaterThan(limitActions(relay, "closed_idle"), 0)
        silent.forEach { $0.close() }
        XCTAssertTrue(waitUntil(timeout: 5) { openConnections(relay) == 0 })
    }

    /// evhttp consumes a request's bytes as it parses them, so an empty input buffer does not mean idle:
    /// a connection in the middle of a chunked body is never closed to make room.
    func testHalfReceivedRequestIsNotIdle() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 2]])
        let uploading = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertEqual(try uploading.send(method: "GET", path: "/first").status, 200)
        try uploading.writeRaw("POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        // Quiet for less long than the uploading one: were the half-received request idle, it would be
        // the one closed for the newcomer.
        let idle = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertEqual(try idle.send(method: "GET", path: "/idle").status, 200)

        let newcomer = try HTTPTestConnection(port: relay.proxyPort)
        XCTAssertTrue(waitUntil(timeout: 5) { idle.peerClosed }, "the sweep freed the idle connection's slot")
        XCTAssertFalse(uploading.peerClosed, "a half-received request is not idle")
        XCTAssertEqual(try newcomer.send(method: "GET", path: "/newcomer").status, 200)
        try uploading.writeRaw("6\r\n world\r\n0\r\n\r\n")
        let echoed = try uploading.readResponse(requestMethod: "POST")
        XCTAssertEqual(echoed.status, 200)
        XCTAssertEqual(echoed.bodyText, "hello world")
        XCTAssertEqual(limitActions(relay, "closed_idle"), 1)
    }

    /// Many short connections, some dropped mid-request: the count returns to zero (a leak here would
    /// eventually stop the relay from accepting anyone).
    func testCountDoesNotDriftUnderChurn() throws {
        let relay = try startRelay(["limits": ["max_client_connections": 4]])
        let port = relay.proxyPort
        let results = HTTPTestClient.concurrently(40) { index in
            if index % 5 == 0 {
                let dropped = try HTTPTestConnection(port: port)
                try dropped.write(method: "POST", path: "/dropped", headers: [("Content-Length", "100")])
                dropped.close()
                return 0
            }
            return try HTTPTestClient.send(port: port, method: "GET", path: "/churn/\(index)").status
        }
        for result in results {
            let status = try result.get()
            XCTAssertTrue([0, 200, 503].contains(status), "status \(status)")
        }
        XCTAssertTrue(waitUntil(timeout: 10) { openConnections(relay) == 0 }, "left: \(String(describing: openConnections(relay)))")
        XCTAssertEqual(try get(relay, "/still-serving").status, 200)
    }
}

/// The open-file limit is raised at start to fit the connection limits.
final class FileDescriptorBudgetTests: XCTestCase {
    func testSoftLimitIsRaisedToFitTheConnectionLimits() throws {
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        var original = rlimit()
        XCTAssertEqual(getrlimit(resource, &original), 0)
        defer { var restore = original; setrlimit(resource, &restore) }
        var limits = Config.Limits()
        limits.maxClientConnections = 2000
        let needed = rlim_t(FileDescriptorBudget.needed(for: limits))
        try XCTSkipIf(original.rlim_max < needed, "hard open-file limit \(original.rlim_max) is below \(needed)")
        var lowered = rlimit(rlim_cur: 256, rlim_max: original.rlim_max)
        XCTAssertEqual(setrlimit(resource, &lowered), 0)

        XCTAssertNil(FileDescriptorBudget.ensure(for: limits), "no warning: the hard limit allows it")
        var now = rlimit()
        XCTAssertEqual(getrlimit(resource, &now), 0)
        XCTAssertGreaterThanOrEqual(now.rlim_cur, needed)
    }
}
