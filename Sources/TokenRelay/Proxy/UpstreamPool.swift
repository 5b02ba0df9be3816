import CLibevent

/// Keep-alive connections to the upstream, at most one request in flight on each.
///
/// evhttp queues a second request behind the first on the same connection (no pipelining), so sharing
/// one would add head-of-line blocking; the pool hands each request a connection of its own and makes
/// the rest wait in a FIFO once `maxConnections` are busy. The FIFO is bounded (`maxWaiters`): beyond
/// it a request is refused at once rather than queued without limit; how long a waiter may wait is the
/// caller's timer. An idle connection the upstream closed is
/// reconnected by evhttp on its next use, so connections are never freed before shutdown.
///
/// evhttp has one timeout per connection (connect, send, read, and while idle: docs/evhttp.md, one-timeout), so
/// the pool switches it with the connection's phase: the response timeout while a request waits for
/// headers, the stream idle timeout once a response is flowing (an idle SSE stream must not be cut by
/// the header timeout), and the pool idle timeout while it sits unused, which closes it before the
/// upstream's own keep-alive timeout races us.
///
/// A connection is reused only if the response consumed every byte the upstream sent: anything left
/// over (a second response in the same write, a body on a 204/304) would be read as the answer to the
/// *next* client's request. Such a connection is retired instead, and a fresh one takes its place.
final class UpstreamPool {
    struct Timeouts {
        var response: Double
        var streamIdle: Double
        var idle: Double
    }

    private let factory: HTTPConnectionFactory
    private let maxConnections: Int
    private let maxWaiters: Int
    private let timeouts: Timeouts
    private var idle: [OpaquePointer] = []
    private var all: [OpaquePointer] = []
    private var waiters: [(id: ObjectIdentifier, grant: (OpaquePointer) -> Void)] = []
    /// Connections that must not carry another request, freed on the next loop pass.
    private let retirement: ConnectionRetirement
    /// Told how many unread bytes a retired connection had (the proxy logs and counts it).
    var onDesyncedConnection: ((Int) -> Void)?
    /// Set when a reload replaced this pool: connections still in use finish their request here, then
    /// are freed instead of kept (`retire`).
    private var isRetired = false

    enum Acquisition {
        case ready(OpaquePointer)
        /// `grant` will be called with a connection (unless the waiter cancels).
        case queued
        /// Every connection is busy and the wait queue is full.
        case full
    }

    init(loop: EventLoop, factory: HTTPConnectionFactory, maxConnections: Int, maxWaiters: Int, timeouts: Timeouts) {
        retirement = ConnectionRetirement(loop: loop)
        self.factory = factory
        self.maxConnections = maxConnections
        self.maxWaiters = maxWaiters
        self.timeouts = timeouts
    }

    /// Gives a connection now, or later through `grant` (in FIFO order) when all are busy.
    /// `admittedBefore`: the request was admitted under another bound already (a held request), so the
    /// waiter bound does not apply to it.
    func acquire(for waiter: AnyObject, admittedBefore: Bool = false, grant: @escaping (OpaquePointer) -> Void) -> Acquisition {
        if let connection = idle.popLast() { return .ready(connection) }
        if all.count < maxConnections, let connection = factory.makeConnection() {
            all.append(connection)
            return .ready(connection)
        }
        guard admittedBefore || waiters.count < maxWaiters else { return .full }
        waiters.append((ObjectIdentifier(waiter), grant))
        return .queued
    }

    var waiterCount: Int { waiters.count }

    /// A waiter that no longer needs a connection (its client went away).
    func cancelWait(for waiter: AnyObject) {
        waiters.removeAll { $0.id == ObjectIdentifier(waiter) }
    }

    /// Called just before a request is sent on `connection`. Returns whether it goes over an established
    /// keep-alive connection (which the upstream may close at the same moment) rather than a new one.
    func willSend(on connection: OpaquePointer) -> Bool {
        setTimeout(connection, timeouts.response)
        return HTTPConnectionFactory.isConnected(connection)
    }

    /// Response headers are in: from now on only a silent stream ends the request.
    func responseStarted(on connection: OpaquePointer) {
        setTimeout(connection, timeouts.streamIdle)
    }

    func release(_ connection: OpaquePointer) {
        let unread = ConnectionRetirement.unreadBytes(on: connection)
        if unread > 0 { return replace(connection, unreadBytes: unread) }
        setTimeout(connection, timeouts.idle)
        if !waiters.isEmpty {
            waiters.removeFirst().grant(connection)
        } else if isRetired {
            all.removeAll { $0 == connection }
            retirement.retire(connection)
        } else {
            idle.append(connection)
        }
    }

    /// A reload made a new pool for new requests. Requests already using (or queued for) this one keep
    /// it; each connection is freed once it comes back, from the next loop pass rather than inside the
    /// callback that returned it (its request's completion, still running on that connection).
    func retire() {
        guard !isRetired else { return }
        isRetired = true
        idle.forEach { connection in
            all.removeAll { $0 == connection }
            retirement.retire(connection)
        }
        idle = []
    }

    /// Connections out with a request (a retired pool is done once this is 0).
    var busyCount: Int { all.count - idle.count }

    private func replace(_ connection: OpaquePointer, unreadBytes: Int) {
        all.removeAll { $0 == connection }
        retirement.retire(connection)
        onDesyncedConnection?(unreadBytes)
        guard !waiters.isEmpty, let fresh = factory.makeConnection() else { return }
        all.append(fresh)
        setTimeout(fresh, timeouts.idle)
        waiters.removeFirst().grant(fresh)
    }

    private func setTimeout(_ connection: OpaquePointer, _ seconds: Double) {
        var tv = timeval(seconds: seconds)
        evhttp_connection_set_timeout_tv(connection, &tv)
    }

    /// Frees every connection; only once no request is in flight.
    func close() {
        retirement.freeRetired()
        all.forEach { evhttp_connection_free($0) }
        all = []
        idle = []
        waiters = []
    }
}
