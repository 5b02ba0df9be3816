import Foundation
import Glibc
import HTTPTransport
import HTTPWire
import XCTest

/// Connections hold their handlers strongly (no weak reference on the request path: it would give the
/// handler a side table), and a handler usually holds its connection. The end of the connection must
/// break that cycle: both are freed once it has ended, whichever side ended it.
final class ConnectionLifetimeTests: LoopThreadTestCase {
    func testServerConnectionAndItsHandlerAreFreedWhenTheClientLeaves() throws {
        let watch = LifetimeWatch()
        let server = try answeringServer(watch)
        defer { loopThread.sync { server.close() } }
        var client: LoopbackClient? = try LoopbackClient(port: server.port)
        try client?.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(try client?.readResponse().status, 200)
        XCTAssertTrue(loopThread.sync { watch.handler != nil && watch.connection != nil }, "alive while the connection is open")
        client = nil   // closes the socket
        XCTAssertTrue(eventuallyOnLoop { watch.ended != nil && watch.bothFreed }, "the end did not break the cycle")
    }

    func testServerClosingItsConnectionsFreesThemAndTheirHandlers() throws {
        let watch = LifetimeWatch()
        let server = try answeringServer(watch)
        let client = try LoopbackClient(port: server.port)
        try client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200)
        loopThread.sync { server.close() }
        XCTAssertTrue(eventuallyOnLoop { watch.ended != nil && watch.bothFreed }, "closing the server did not break the cycle")
        withExtendedLifetime(client) {}
    }

    func testClientConnectionAndItsHandlerAreFreedWhenTheUpstreamCloses() throws {
        let (listener, port) = try LoopbackListener.open()
        defer { close(listener) }
        let watch = LifetimeWatch()
        let loop = loopThread.loop
        loopThread.sync {
            guard let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: port) else { return }
            WatchedClientHandler(holding: connection, watch: watch)
            connection.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", "upstream")], body: .none)
            connection.finishRequest()
        }
        XCTAssertTrue(loopThread.sync { watch.connection != nil }, "the connection could not be made")
        let accepted = accept(listener, nil, nil)
        XCTAssertGreaterThanOrEqual(accepted, 0)
        _ = LoopbackListener.readHead(accepted)
        close(accepted)   // no answer: the upstream went away
        XCTAssertTrue(eventuallyOnLoop { watch.ended != nil && watch.bothFreed }, "the end did not break the cycle")
    }

    /// A server whose connections each get a `WatchedServerHandler` that answers, watched by `watch`.
    private func answeringServer(_ watch: LifetimeWatch) throws -> HTTPServer {
        let loop = loopThread.loop
        return try loopThread.sync { () -> HTTPServer? in
            try? HTTPServer(loop: loop, host: "127.0.0.1", port: 0, settings: HTTPServer.Settings()) { connection in
                WatchedServerHandler(holding: connection, watch: watch, answers: true)
            }
        }.unwrap()
    }
}
