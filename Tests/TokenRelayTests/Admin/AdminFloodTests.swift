import Foundation
import XCTest

/// The kubelet reaches the admin port over the pod network, so anything there can flood it. Idle
/// connections used to hold its 32 slots (an over-limit probe got 503 at once) and a sustained flood
/// of connections that reconnect as soon as they are closed filled the listen backlog ahead of the
/// probe, which timed out: a liveness restart loop. Connections that say nothing now give way at once.
final class AdminFloodTests: RelayTestCase {
    func testProbesAreAnsweredAtOnceBesideFortyIdleConnections() throws {
        let relay = try startRelay()
        var idle: [HTTPTestConnection] = []
        defer { for connection in idle { connection.close() } }
        for _ in 0..<40 { idle.append(try HTTPTestConnection(port: relay.adminPort, timeout: 2)) }
        for path in ["/readyz", "/healthz", "/readyz", "/healthz"] {
            let response = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: path, timeout: 1)
            XCTAssertEqual(response.status, 200, "\(path) beside 40 idle admin connections")
        }
    }

    func testProbesAreAnsweredWithinASecondDuringASustainedFlood() throws {
        let relay = try startRelay()
        let flood = AdminFlood(port: relay.adminPort, connections: 200)
        flood.start()
        defer { flood.stop() }
        XCTAssertTrue(waitUntil(timeout: 10) { flood.opened >= 200 }, "the flood is under way")

        var failures: [String] = []
        for probe in 0..<20 {
            let path = probe % 2 == 0 ? "/healthz" : "/readyz"
            do {
                let status = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: path, timeout: 1).status
                if status != 200 { failures.append("\(path): \(status)") }
            } catch {
                failures.append("\(path): \(error)")
            }
        }
        XCTAssertEqual(failures, [], "every probe answered within 1 s while 200 connections flood the admin port")
        flood.stop()

        let metrics = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics", timeout: 5).bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_admin_connection_limit_total{action=\"closed_idle\"}"), "the flood's closes are counted")
    }
}

/// Keeps `connections` connections open to a port, half silent and half trickling a request head a
/// byte at a time, and opens a new one for each the server closes, until stopped (bounded by 60 s).
private final class AdminFlood: @unchecked Sendable {
    private let port: Int
    private let count: Int
    private let lock = NSLock()
    private var stopped = false
    private var openedSoFar = 0
    private let done = DispatchSemaphore(value: 0)

    init(port: Int, connections: Int) {
        self.port = port
        count = connections
    }

    var opened: Int { lock.withLock { openedSoFar } }
    private var isStopped: Bool { lock.withLock { stopped } }

    func start() {
        Thread { [self] in
            var open: [HTTPTestConnection?] = Array(repeating: nil, count: count)
            let deadline = Date(timeIntervalSinceNow: 60)
            while !isStopped && Date() < deadline {
                for index in 0..<count {
                    if let connection = open[index], connection.peerClosed {
                        connection.close()
                        open[index] = nil
                    }
                    if open[index] == nil {
                        open[index] = try? HTTPTestConnection(port: port, timeout: 0.2)
                        if open[index] != nil { lock.withLock { openedSoFar += 1 } }
                    } else if index % 2 == 1 {
                        try? open[index]?.writeRaw(index % 4 == 1 ? "G" : "x")
                    }
                }
                Thread.sleep(forTimeInterval: 0.01)   // pacing of the flood, not synchronisation
            }
            for connection in open { connection?.close() }
            done.signal()
        }.start()
    }

    func stop() {
        let wasRunning = lock.withLock {
            defer { stopped = true }
            return !stopped
        }
        if wasRunning { _ = done.wait(timeout: .now() + 10) }
    }
}
