import Foundation
import Glibc
import HTTPTransport
import TLSFixtures
import XCTest

/// The paths on which a connection ends other than an orderly close (`ConnectionLifetimeTests`): a TLS
/// handshake that fails or never finishes, an upstream that stays silent, a request refused over the
/// connection limit, a trickled head evicted at the limit. A connection holds its handler strongly and the
/// handler holds the connection; each of these ends must break that cycle, or every such end leaks both
/// (and, for an upstream connection, whatever the handler holds: a client session, its exchange).
final class ConnectionLifetimeFailureTests: LoopThreadTestCase {
    /// Opens an upstream connection whose handler holds it, sends GET /, and returns its watch.
    private func openClient(port: UInt16, tls: TransportTLSClientContext? = nil, connectTimeout: Double? = nil,
                            silence: Double? = nil) -> LifetimeWatch {
        let watch = LifetimeWatch()
        let loop = loopThread.loop
        loopThread.sync {
            guard let connection = try? HTTPClientConnection(loop: loop, host: "localhost", port: port, tls: tls,
                                                             connectTimeout: connectTimeout) else { return }
            WatchedClientHandler(holding: connection, watch: watch)
            connection.setSilenceLimit(silence)
            connection.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", "upstream")], body: .none)
            connection.finishRequest()
        }
        return watch
    }

    func testAFailedTLSHandshakeFreesTheConnectionAndItsHandler() throws {
        let (listener, port) = try LoopbackListener.open()
        defer { close(listener) }
        let tls = try TransportTLSClientContext(caFile: TestPKI.shared().caFile.path)
        let watch = openClient(port: port, tls: tls)
        XCTAssertTrue(loopThread.sync { watch.connection != nil }, "the connection could not be made")
        let accepted = accept(listener, nil, nil)
        XCTAssertGreaterThanOrEqual(accepted, 0)
        _ = "HTTP/1.1 400 Not TLS\r\n\r\n".withCString { write(accepted, $0, strlen($0)) }
        close(accepted)
        XCTAssertTrue(eventuallyOnLoop { watch.ended != nil && watch.bothFreed }, "a failed handshake did not break the cycle")
    }

    func testAHandshakeThatNeverFinishesFreesTheConnectionAtTheConnectTimeout() throws {
        let (listener, port) = try LoopbackListener.open()
        defer { close(listener) }
        let tls = try TransportTLSClientContext(caFile: TestPKI.shared().caFile.path)
        let watch = openClient(port: port, tls: tls, connectTimeout: 0.2)
        let accepted = accept(listener, nil, nil)   // accepted, and never answered
        defer { if accepted >= 0 { close(accepted) } }
        XCTAssertTrue(eventuallyOnLoop { watch.ended != nil && watch.bothFreed }, "the connect timeout did not break the cycle")
    }

    func testASilentUpstreamFreesTheConnectionAtTheSilenceLimit() throws {
        let (listener, port) = try LoopbackListener.open()
        defer { close(listener) }
        let watch = openClient(port: port, silence: 0.2)
        let accepted = accept(listener, nil, nil)
        defer { if accepted >= 0 { close(accepted) } }
        _ = LoopbackListener.readHead(accepted)   // read, never answered
        XCTAssertTrue(eventuallyOnLoop { watch.ended == .timedOut && watch.bothFreed }, "the silence limit did not break the cycle")
    }

    /// A server whose connections each get a `WatchedServerHandler` that never answers; `watches` in the
    /// order of acceptance.
    private func server(_ settings: HTTPServer.Settings) throws -> (HTTPServer, () -> [LifetimeWatch]) {
        let loop = loopThread.loop
        final class Watches: @unchecked Sendable { var all: [LifetimeWatch] = [] }
        let watches = Watches()
        let server = try loopThread.sync { () -> HTTPServer? in
            try? HTTPServer(loop: loop, host: "127.0.0.1", port: 0, settings: settings) { connection in
                let watch = LifetimeWatch()
                WatchedServerHandler(holding: connection, watch: watch, answers: false)
                watches.all.append(watch)
            }
        }.unwrap()
        return (server, { watches.all })
    }

    private func limited(grace: Double) -> HTTPServer.Settings {
        HTTPServer.Settings(maxConnections: 1, overLimitAllowance: 4, idleGrace: grace,
                            overLimitResponse: HTTPResponseHead(status: 503, reason: "Service Unavailable"),
                            overLimitBody: Array("busy\n".utf8))
    }

    func testARequestRefusedOverTheLimitFreesItsConnectionAndHandler() throws {
        let (server, watches) = try server(limited(grace: 30))
        defer { loopThread.sync { server.close() } }
        let busy = try LoopbackClient(port: server.port)
        try busy.send("GET /held HTTP/1.1\r\nHost: h\r\n\r\n")   // never answered: the one slot stays taken
        XCTAssertTrue(eventuallyOnLoop { watches().count == 1 })
        let over = try LoopbackClient(port: server.port)
        try over.send("GET /over HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try over.readResponse().status, 503)
        XCTAssertTrue(over.readEOF())
        shutdown(over.fd, Int32(SHUT_RDWR))   // the lingering close ends with the client's
        XCTAssertTrue(eventuallyOnLoop { watches().count == 2 && watches()[1].ended == .refusedOverLimit && watches()[1].bothFreed },
                      "a refusal over the limit did not break the cycle")
        withExtendedLifetime(busy) {}
    }

    func testAStalledHeadEvictedAtTheLimitFreesItsConnectionAndHandler() throws {
        let (server, watches) = try server(limited(grace: 0.2))
        defer { loopThread.sync { server.close() } }
        let trickling = try LoopbackClient(port: server.port)
        try trickling.send("GET /slow HTTP/1.1\r\nHo")
        XCTAssertTrue(eventuallyOnLoop { watches().count == 1 })
        usleep(300_000)   // past the grace: the head counts as stalled (a duration under test, not a synchronisation)
        let newcomer = try LoopbackClient(port: server.port)
        try newcomer.send("GET /fresh HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(try trickling.readResponse().status, 408)
        XCTAssertTrue(eventuallyOnLoop { watches()[0].ended == .headTimeout && watches()[0].bothFreed },
                      "evicting a stalled head did not break the cycle")
        withExtendedLifetime(newcomer) {}
    }

    /// An exchange its owner lets go of without `cancel()` stops: its deinit closes the connection, and its
    /// completion never runs. The connection holds its handler strongly, so an exchange that were its own
    /// connection's handler would be kept alive by it, run to its deadline and report to an owner that had
    /// dropped it.
    func testAnExchangeLetGoOfClosesItsConnectionAndNeverCompletes() throws {
        let (listener, port) = try LoopbackListener.open()
        defer { close(listener) }
        final class Completed: @unchecked Sendable { var count = 0 }
        let completed = Completed()
        let loop = loopThread.loop
        final class Held: @unchecked Sendable { weak var exchange: HTTPExchange? }
        let held = Held()
        loopThread.sync {
            let request = HTTPExchange.Request(host: "127.0.0.1", port: port, method: "GET", target: "/", fields: [("Host", "x")])
            let exchange = HTTPExchange(loop: loop, request: request, limits: HTTPExchange.Limits(timeoutSeconds: 3)) { _ in
                completed.count += 1
            }
            held.exchange = exchange
        }   // the only reference goes here
        let accepted = accept(listener, nil, nil)
        XCTAssertGreaterThanOrEqual(accepted, 0)
        defer { if accepted >= 0 { close(accepted) } }
        var wait = timeval(tv_sec: 1, tv_usec: 0)   // well inside the exchange's 3 s deadline
        setsockopt(accepted, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
        _ = LoopbackListener.readHead(accepted)
        var byte: UInt8 = 0
        XCTAssertEqual(read(accepted, &byte, 1), 0, "the connection of an exchange let go of was not closed")
        // Once the exchange is freed its completion is gone with it: it can never run.
        XCTAssertTrue(eventuallyOnLoop(2) { held.exchange == nil }, "the exchange outlived its owner's reference")
        XCTAssertEqual(loopThread.sync { completed.count }, 0, "an exchange let go of reported to its former owner")
    }
}
