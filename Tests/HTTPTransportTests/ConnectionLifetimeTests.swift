import Foundation
import Glibc
import HTTPTransport
import HTTPWire
import XCTest

/// Connections hold their handlers strongly (no weak reference on the request path: it would give the
/// handler a side table), and a handler usually holds its connection. The end of the connection must
/// break that cycle: both are freed once it has ended, whichever side ended it.
final class ConnectionLifetimeTests: LoopThreadTestCase {
    /// Weak references the test thread reads through the loop thread (`sync`).
    private final class Watch: @unchecked Sendable {
        weak var handler: AnyObject?
        weak var connection: AnyObject?
        var ended = false
        var bothFreed: Bool { handler == nil && connection == nil }
    }

    private final class ServerHandler: HTTPServerConnectionHandler {
        var connection: HTTPServerConnection?   // the cycle under test
        let watch: Watch
        init(_ watch: Watch) { self.watch = watch }
        func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {}
        func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
        func connectionReceivedEnd(_ connection: HTTPServerConnection) {
            connection.respond(HTTPResponseHead(status: 200, reason: "OK"), body: Array("ok".utf8))
        }
        func connectionCanSendMore(_ connection: HTTPServerConnection) {}
        func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) { watch.ended = true }
    }

    private final class ClientHandler: HTTPClientConnectionHandler {
        var connection: HTTPClientConnection?   // the cycle under test
        let watch: Watch
        init(_ watch: Watch) { self.watch = watch }
        func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}
        func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {}
        func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
        func connectionReceivedEnd(_ connection: HTTPClientConnection) {}
        func connectionCanSendMore(_ connection: HTTPClientConnection) {}
        func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) { watch.ended = true }
    }

    /// Polls (bounded) on the loop thread until the condition holds.
    private func eventually(_ condition: @escaping () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            if loopThread.sync(condition) { return true }
            usleep(2000)
        }
        return loopThread.sync(condition)
    }

    func testServerConnectionAndItsHandlerAreFreedWhenTheClientLeaves() throws {
        let watch = Watch()
        let loop = loopThread.loop
        let server = try loopThread.sync { () -> HTTPServer? in
            try? HTTPServer(loop: loop, host: "127.0.0.1", port: 0, settings: HTTPServer.Settings()) { connection in
                let handler = ServerHandler(watch)
                handler.connection = connection
                connection.handler = handler
                watch.handler = handler
                watch.connection = connection
            }
        }.unwrap()
        defer { loopThread.sync { server.close() } }
        var client: LoopbackClient? = try LoopbackClient(port: server.port)
        try client?.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(try client?.readResponse().status, 200)
        XCTAssertTrue(loopThread.sync { watch.handler != nil && watch.connection != nil }, "alive while the connection is open")
        client = nil   // closes the socket
        XCTAssertTrue(eventually { watch.ended && watch.bothFreed }, "the end did not break the cycle")
    }

    func testServerClosingItsConnectionsFreesThemAndTheirHandlers() throws {
        let watch = Watch()
        let loop = loopThread.loop
        let server = try loopThread.sync { () -> HTTPServer? in
            try? HTTPServer(loop: loop, host: "127.0.0.1", port: 0, settings: HTTPServer.Settings()) { connection in
                let handler = ServerHandler(watch)
                handler.connection = connection
                connection.handler = handler
                watch.handler = handler
                watch.connection = connection
            }
        }.unwrap()
        let client = try LoopbackClient(port: server.port)
        try client.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        XCTAssertEqual(try client.readResponse().status, 200)
        loopThread.sync { server.close() }
        XCTAssertTrue(eventually { watch.ended && watch.bothFreed }, "closing the server did not break the cycle")
        withExtendedLifetime(client) {}
    }

    func testClientConnectionAndItsHandlerAreFreedWhenTheUpstreamCloses() throws {
        let (listener, port) = try LoopbackListener.open()
        defer { close(listener) }
        let watch = Watch()
        let loop = loopThread.loop
        loopThread.sync {
            guard let connection = try? HTTPClientConnection(loop: loop, host: "127.0.0.1", port: port) else { return }
            let handler = ClientHandler(watch)
            handler.connection = connection
            connection.handler = handler
            watch.handler = handler
            watch.connection = connection
            connection.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", "upstream")], body: .none)
            connection.finishRequest()
        }
        XCTAssertTrue(loopThread.sync { watch.connection != nil }, "the connection could not be made")
        let accepted = accept(listener, nil, nil)
        XCTAssertGreaterThanOrEqual(accepted, 0)
        _ = LoopbackListener.readHead(accepted)
        close(accepted)   // no answer: the upstream went away
        XCTAssertTrue(eventually { watch.ended && watch.bothFreed }, "the end did not break the cycle")
    }
}
