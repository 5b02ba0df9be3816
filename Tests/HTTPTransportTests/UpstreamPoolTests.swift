import Foundation
import HTTPTransport
import XCTest

final class UpstreamPoolTests: XCTestCase {
    private var loopThread: LoopThread!

    override func setUpWithError() throws {
        loopThread = try LoopThread()
    }

    override func tearDown() {
        loopThread.stop()
        loopThread = nil
    }

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
