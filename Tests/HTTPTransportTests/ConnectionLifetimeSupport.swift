import Foundation
import HTTPTransport

// What ConnectionLifetimeTests and ConnectionLifetimeFailureTests share: handlers that hold their
// connection (the cycle under test) and a watch that sees, through weak references, whether both are freed.

/// Weak references the test thread reads through the loop thread (`sync`).
final class LifetimeWatch: @unchecked Sendable {
    weak var handler: AnyObject?
    weak var connection: AnyObject?
    var ended: ConnectionEnd?
    var bothFreed: Bool { handler == nil && connection == nil }
}

/// Holds its server connection; answers each request 200 "ok", or never (`answers: false`).
final class WatchedServerHandler: HTTPServerConnectionHandler {
    var connection: HTTPServerConnection?
    let watch: LifetimeWatch
    private let answers: Bool

    /// Makes the handler of `connection`, holding it, and points `watch` at both.
    @discardableResult
    init(holding connection: HTTPServerConnection, watch: LifetimeWatch, answers: Bool) {
        self.watch = watch
        self.answers = answers
        self.connection = connection
        connection.handler = self
        watch.handler = self
        watch.connection = connection
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {}
    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        if answers { connection.respond(HTTPResponseHead(status: 200, reason: "OK"), body: Array("ok".utf8)) }
    }
    func connectionCanSendMore(_ connection: HTTPServerConnection) {}
    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) { watch.ended = ended }
}

/// Holds its upstream connection and records how it ended.
final class WatchedClientHandler: HTTPClientConnectionHandler {
    var connection: HTTPClientConnection?
    let watch: LifetimeWatch

    /// Makes the handler of `connection`, holding it, and points `watch` at both.
    @discardableResult
    init(holding connection: HTTPClientConnection, watch: LifetimeWatch) {
        self.watch = watch
        self.connection = connection
        connection.handler = self
        watch.handler = self
        watch.connection = connection
    }

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {}
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {}
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) { watch.ended = ended }
}

extension LoopThreadTestCase {
    /// Polls (bounded) on the loop thread until the condition holds.
    func eventuallyOnLoop(_ seconds: Double = 5, _ condition: @escaping () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if loopThread.sync(condition) { return true }
            usleep(2000)
        }
        return loopThread.sync(condition)
    }
}
