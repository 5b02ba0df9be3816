import Foundation
import Glibc
import HTTPTransport
import TLSFixtures
import XCTest

/// The loop thread's read(2) calls so far (`syscr` in /proc/thread-self/io, counted by the kernel; the
/// read of the file itself counts one).
private func threadReadCalls() -> Int {
    let fd = open("/proc/thread-self/io", O_RDONLY)
    guard fd >= 0 else { return -1 }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 512)
    let n = read(fd, &buffer, buffer.count)
    guard n > 0 else { return -1 }
    let text = String(decoding: buffer[0..<n], as: UTF8.self)
    guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("syscr:") }) else { return -1 }
    return Int(line.dropFirst(6).trimmingCharacters(in: .whitespaces)) ?? -1
}

/// Sends `total` requests for `target` one after the other on one connection, each started from a timer
/// after the previous response ended (nothing crosses threads meanwhile), and counts the loop thread's
/// read(2) calls from the first request to the last response's end.
private final class ChainedRequests: HTTPClientConnectionHandler, @unchecked Sendable {
    let done = DispatchSemaphore(value: 0)
    let target: String
    let total: Int
    var next: TransportTimer?
    weak var connection: HTTPClientConnection?
    // Touched on the loop thread only, read by the test after `done`.
    var bodies: [[UInt8]] = []
    var failure: String?
    var readsAtStart = 0
    var readsAtEnd = 0

    init(target: String, total: Int) {
        self.target = target
        self.total = total
    }

    func start() {
        readsAtStart = threadReadCalls()
        send()
    }

    func send() {
        bodies.append([])
        connection?.startRequest(method: "GET", target: Array(target.utf8), fields: [("Host", "localhost")], body: .none)
        connection?.finishRequest()
    }

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        if head.status != 200 { failure = "status \(head.status)" }
    }
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        bodies[bodies.count - 1].append(contentsOf: bytes)
    }
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        if bodies.count < total {
            next?.schedule(after: 0)
        } else {
            readsAtEnd = threadReadCalls()
            done.signal()
        }
    }
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        failure = "ended: \(ended)"
        done.signal()
    }
}

/// Reading TLS (docs/data-plane.md, "Reading TLS"): with read-ahead one read(2) takes every record the
/// socket holds, and the reader stops calling `SSL_read` once OpenSSL holds nothing (another call could
/// only end in a read(2) answered EAGAIN). Counted, not timed: the kernel's count of the loop thread's
/// read calls.
final class UpstreamTLSReadTests: LoopThreadTestCase {
    /// Each response is a head and 8 body records leaving in one TCP segment. Read-ahead with the stop
    /// takes each response in one read(2); without the stop it would be 2 (the last one answered EAGAIN),
    /// without read-ahead 18 (a record's header and body apart). The bound leaves room for a segment
    /// split in two, never for either of those.
    func testResponsesInManyRecordsArriveWholeInAboutOneReadEach() throws {
        let upstream = try TLSTestServer(role: .upstream, identity: try TestPKI.shared().server)
        defer { upstream.stop() }
        let tls = try TransportTLSClientContext(caFile: try TestPKI.shared().caFile.path)
        let records = 8, responses = 20
        let loop = loopThread.loop
        let warmUp = ChainedRequests(target: "/", total: 1)
        let chain = ChainedRequests(target: "/records?\(records)", total: responses)
        let connection: HTTPClientConnection? = loopThread.sync {
            guard let connection = try? HTTPClientConnection(loop: loop, host: "localhost", port: upstream.port, tls: tls, connectTimeout: 10)
            else { return nil }
            warmUp.connection = connection
            connection.handler = warmUp
            warmUp.start()
            return connection
        }
        XCTAssertNotNil(connection)
        // The handshake, the session tickets and a first answer: read before the count starts.
        XCTAssertEqual(warmUp.done.wait(timeout: .now() + 20), .success)
        XCTAssertNil(loopThread.sync { warmUp.failure }, upstream.stderrText)
        loopThread.sync {
            chain.connection = connection
            chain.next = TransportTimer(loop: loop) { [unowned chain] in chain.send() }
            connection?.handler = chain
            chain.start()
        }
        XCTAssertEqual(chain.done.wait(timeout: .now() + 30), .success)
        let (failure, bodies, reads) = loopThread.sync { (chain.failure, chain.bodies, chain.readsAtEnd - chain.readsAtStart) }
        XCTAssertNil(failure, upstream.stderrText)
        let expected = (0..<records).flatMap { [UInt8](repeating: UInt8(97 + $0), count: 100) }
        XCTAssertEqual(bodies.count, responses)
        XCTAssertTrue(bodies.allSatisfy { $0 == expected }, "every response whole")
        XCTAssertGreaterThanOrEqual(reads, responses, "one read(2) at least per response")
        XCTAssertLessThan(reads, responses * 3 / 2, "read(2) calls for \(responses) responses of \(records + 1) records each")
        loopThread.sync {
            chain.next = nil
            connection?.close()
        }
    }
}
