import CLibevent

/// Keep-alive connections to the upstream, at most one request in flight on each.
///
/// evhttp queues a second request behind the first on the same connection (no pipelining), so sharing
/// one would add head-of-line blocking; the pool hands each request a connection of its own and makes
/// the rest wait in a FIFO once `maxConnections` are busy. An idle connection the upstream closed is
/// reconnected by evhttp on its next use, so connections are never freed before shutdown.
final class UpstreamPool {
    private let factory: HTTPConnectionFactory
    private let maxConnections: Int
    private var idle: [OpaquePointer] = []
    private var all: [OpaquePointer] = []
    private var waiters: [(id: ObjectIdentifier, grant: (OpaquePointer) -> Void)] = []

    init(factory: HTTPConnectionFactory, maxConnections: Int) {
        self.factory = factory
        self.maxConnections = maxConnections
    }

    /// Gives a connection now, or later through `grant` (in FIFO order) when all are busy.
    /// Returns the connection when one was available immediately.
    func acquire(for waiter: AnyObject, grant: @escaping (OpaquePointer) -> Void) -> OpaquePointer? {
        if let connection = idle.popLast() { return connection }
        if all.count < maxConnections, let connection = factory.makeConnection() {
            all.append(connection)
            return connection
        }
        waiters.append((ObjectIdentifier(waiter), grant))
        return nil
    }

    /// A waiter that no longer needs a connection (its client went away).
    func cancelWait(for waiter: AnyObject) {
        waiters.removeAll { $0.id == ObjectIdentifier(waiter) }
    }

    func release(_ connection: OpaquePointer) {
        if !waiters.isEmpty {
            waiters.removeFirst().grant(connection)
        } else {
            idle.append(connection)
        }
    }

    /// Frees every connection; only once no request is in flight.
    func close() {
        all.forEach { evhttp_connection_free($0) }
        all = []
        idle = []
        waiters = []
    }
}
