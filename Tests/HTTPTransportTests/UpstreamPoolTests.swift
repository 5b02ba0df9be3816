import Foundation
import HTTPTransport
import XCTest

final class UpstreamPoolTests: LoopThreadTestCase {
    /// Sends GET `target` on `connection` and waits for the end of its response.
    private func exchange(_ connection: HTTPClientConnection, _ target: String) -> RecordingClient {
        let recorder = RecordingClient()
        loopThread.sync {
            connection.handler = recorder
            connection.startRequest(method: "GET", target: Array(target.utf8), fields: [("Host", "u")], body: .none)
            connection.finishRequest()
        }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        return recorder
    }

    func testReleasedConnectionsAreReused() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let loop = loopThread.loop
        let pool = loopThread.sync { UpstreamPool(loop: loop, host: "127.0.0.1", port: server.port) }
        var seen: [ObjectIdentifier] = []
        for i in 0..<3 {
            let connection: HTTPClientConnection = loopThread.sync {
                var got: HTTPClientConnection?
                pool.acquire { got = try? $0.get() }
                return got!
            }
            seen.append(ObjectIdentifier(connection))
            _ = exchange(connection, "/echo?\(i)")
            loopThread.sync { pool.release(connection) }
        }
        XCTAssertEqual(Set(seen).count, 1, "one connection served all three")
        XCTAssertEqual(loopThread.sync { pool.openCount }, 1)
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 1)
        loopThread.sync { pool.closeIdle() }
    }

    /// With every connection busy, requests wait and are served in arrival order as connections come back;
    /// a cancelled wait is skipped.
    func testWaitersAreServedInOrder() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let loop = loopThread.loop
        let order = ResultBox<[String]>()
        order.value = []
        let state: (UpstreamPool, HTTPClientConnection, UpstreamPool.Ticket) = loopThread.sync {
            let pool = UpstreamPool(loop: loop, host: "127.0.0.1", port: server.port, settings: .init(maxConnections: 1))
            var first: HTTPClientConnection?
            pool.acquire { first = try? $0.get(); order.value!.append("first") }
            let cancelled = pool.acquire { _ in order.value!.append("cancelled") }
            pool.acquire { result in
                order.value!.append("second")
                if let connection = try? result.get() { pool.release(connection) }
            }
            pool.acquire { result in
                order.value!.append("third")
                if let connection = try? result.get() { pool.release(connection) }
            }
            return (pool, first!, cancelled)
        }
        let (pool, first, cancelled) = state
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 3)
        loopThread.sync { cancelled.cancel() }
        _ = exchange(first, "/echo")
        loopThread.sync { pool.release(first) }
        XCTAssertEqual(loopThread.sync { order.value! }, ["first", "second", "third"])
        XCTAssertEqual(loopThread.sync { pool.openCount }, 1)
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 0)
        loopThread.sync { pool.closeIdle() }
    }

    /// An idle connection the upstream closes leaves the pool at once; a connection that cannot be reused
    /// is closed on release and its slot goes to the next waiter as a fresh connection.
    func testClosedAndUnusableConnectionsFreeTheirSlot() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        let loop = loopThread.loop
        let pool = loopThread.sync { UpstreamPool(loop: loop, host: "127.0.0.1", port: upstream.port, settings: .init(maxConnections: 1)) }
        let connection: HTTPClientConnection = loopThread.sync {
            var got: HTTPClientConnection?
            pool.acquire { got = try? $0.get() }
            return got!
        }
        _ = exchange(connection, "/a")
        loopThread.sync { pool.release(connection) }
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 1)
        upstream.stop()   // the upstream closes the idle connection
        let deadline = Date().addingTimeInterval(5)
        while loopThread.sync({ pool.openCount }) != 0 && Date() < deadline { usleep(2000) }
        XCTAssertEqual(loopThread.sync { pool.openCount }, 0)
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 0)
    }
}

/// The waiter cap and its priority lane, wait limits, cancellation, retirement and the counts.
final class UpstreamPoolWaiterTests: LoopThreadTestCase {
    private var server: TransportTestServer!

    override func setUpWithError() throws {
        try super.setUpWithError()
        server = try TransportTestServer()
    }

    override func tearDown() {
        super.tearDown()
        server.stop()
        server = nil
    }

    /// A pool of `max` connections, all taken (returned for release by the test).
    private func busyPool(max: Int, waiters: Int) -> (UpstreamPool, [HTTPClientConnection]) {
        let loop = loopThread.loop
        let port = server.port
        return loopThread.sync {
            let pool = UpstreamPool(loop: loop, host: "127.0.0.1", port: port, settings: .init(maxConnections: max, maxWaiters: waiters))
            var taken: [HTTPClientConnection] = []
            for _ in 0..<max { pool.acquire(lane: .arriving) { if let c = try? $0.get() { taken.append(c) } } }
            return (pool, taken)
        }
    }

    /// Completes one request on `connection` so that it is reusable, then releases it.
    private func useAndRelease(_ pool: UpstreamPool, _ connection: HTTPClientConnection) {
        let recorder = RecordingClient()
        loopThread.sync {
            connection.handler = recorder
            connection.startRequest(method: "GET", target: Array("/echo".utf8), fields: [("Host", "u")], body: .none)
            connection.finishRequest()
        }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
        loopThread.sync { pool.release(connection) }
    }

    func testArrivalsBeyondTheCapAreRefusedAtOnceButAdmittedOnesNeverAre() throws {
        let (pool, taken) = busyPool(max: 1, waiters: 2)
        let order = ResultBox<[String]>()
        order.value = []
        let refusals: [UpstreamPool.AcquireFailure] = loopThread.sync {
            var failures: [UpstreamPool.AcquireFailure] = []
            func enqueue(_ name: String, _ lane: UpstreamPool.Lane) {
                pool.acquire(lane: lane) { result in
                    switch result {
                    case .success(let connection):
                        order.value!.append(name)
                        pool.release(connection)
                    case .failure(let failure):
                        failures.append(failure)
                    }
                }
            }
            enqueue("new1", .arriving)
            enqueue("new2", .arriving)
            enqueue("new3", .arriving)        // over the cap: refused before acquire returns
            for i in 1...5 { enqueue("held\(i)", .admitted) }   // past the cap, never refused
            return failures
        }
        XCTAssertEqual(refusals, [.tooManyWaiters])
        XCTAssertEqual(loopThread.sync { pool.waitingCount(.arriving) }, 2)
        XCTAssertEqual(loopThread.sync { pool.waitingCount(.admitted) }, 5)
        XCTAssertEqual(loopThread.sync { pool.busyCount }, 1)
        useAndRelease(pool, taken[0])
        XCTAssertEqual(loopThread.sync { order.value! }, ["held1", "held2", "held3", "held4", "held5", "new1", "new2"],
                       "the admitted lane first, each lane in order")
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 0)
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 1)
        loopThread.sync { pool.closeIdle() }
    }

    func testWaitLimitFailsTheWaiterAndFreesItsPlace() throws {
        let (pool, taken) = busyPool(max: 1, waiters: 1)
        let outcome = ResultBox<UpstreamPool.AcquireFailure>()
        let signal = DispatchSemaphore(value: 0)
        let started = Date()
        loopThread.sync {
            pool.acquire(lane: .arriving, waitLimit: 0.2) { result in
                if case .failure(let failure) = result { outcome.value = failure }
                signal.signal()
            }
        }
        XCTAssertEqual(signal.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(outcome.value, .waitTimedOut)
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.15)
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 0)
        // The place is free again: the next arrival may wait.
        let got = ResultBox<Bool>()
        loopThread.sync { pool.acquire(lane: .arriving) { got.value = (try? $0.get()) != nil } }
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 1)
        useAndRelease(pool, taken[0])
        XCTAssertEqual(loopThread.sync { got.value }, true)
        loopThread.sync { pool.closeIdle() }
    }

    func testCancelledWaiterLeavesTheCountAndIsNeverCalled() throws {
        let (pool, taken) = busyPool(max: 1, waiters: 1)
        let called = ResultBox<Bool>()
        called.value = false
        let ticket = loopThread.sync { pool.acquire(lane: .arriving, waitLimit: 0.1) { _ in called.value = true } }
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 1)
        loopThread.sync { ticket.cancel() }
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 0, "a client that went away frees its place at once")
        // Many give-ups while the connection stays busy do not use up the cap.
        for _ in 0..<200 { loopThread.sync { pool.acquire(lane: .arriving) { _ in called.value = true }.cancel() } }
        XCTAssertEqual(loopThread.sync { pool.waitingCount }, 0)
        useAndRelease(pool, taken[0])
        XCTAssertEqual(loopThread.sync { called.value }, false)
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 1)
        loopThread.sync { pool.closeIdle() }
    }

    func testRetiredPoolRefusesNewRequestsAndClosesConnectionsAsTheyComeBack() throws {
        let (pool, taken) = busyPool(max: 2, waiters: 4)
        useAndRelease(pool, taken[1])                      // one idle, one busy
        XCTAssertEqual(loopThread.sync { (pool.busyCount, pool.idleCount) }.0, 1)
        let drained = DispatchSemaphore(value: 0)
        let refusal = ResultBox<UpstreamPool.AcquireFailure>()
        loopThread.sync {
            pool.onDrained = { drained.signal() }
            pool.retire()
            pool.acquire(lane: .admitted) { if case .failure(let failure) = $0 { refusal.value = failure } }
        }
        XCTAssertEqual(refusal.value, .retired)
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 0, "idle connections closed at once")
        XCTAssertEqual(loopThread.sync { pool.openCount }, 1)
        useAndRelease(pool, taken[0])
        XCTAssertEqual(drained.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(loopThread.sync { pool.openCount }, 0, "the busy one closed when it came back")
    }

    func testIdleConnectionsAreClosedAfterTheIdleTimeout() throws {
        let loop = loopThread.loop
        let port = server.port
        let pool = loopThread.sync { UpstreamPool(loop: loop, host: "127.0.0.1", port: port, settings: .init(idleTimeout: 0.2)) }
        let connection: HTTPClientConnection = loopThread.sync {
            var got: HTTPClientConnection?
            pool.acquire(lane: .arriving) { got = try? $0.get() }
            return got!
        }
        useAndRelease(pool, connection)
        XCTAssertEqual(loopThread.sync { pool.idleCount }, 1)
        let deadline = Date().addingTimeInterval(5)
        while loopThread.sync({ pool.openCount }) != 0 && Date() < deadline { usleep(5000) }
        XCTAssertEqual(loopThread.sync { pool.openCount }, 0)
    }
}
