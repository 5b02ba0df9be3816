import HTTPWire

/// Connections to one upstream (a host name or an IP literal, plain or TLS), reused while `isReusable`, at most `maxConnections` open; when
/// all are busy, requests wait in arrival order (first come, first served) instead of being refused.
///
/// The pool only manages connections. What to do with a request whose connection failed (retry on a
/// fresh one, answer 502) is the caller's decision; `responseStarted` in the connection's end report
/// tells whether the upstream may have acted on it.
public final class UpstreamPool {
    public struct Settings: Sendable {
        public var maxConnections: Int
        /// Idle connections kept for reuse; more are closed when released.
        public var maxIdle: Int
        public var limits: HTTPWireLimits
        /// TLS to the upstream (nil: plain TCP). Connections are kept alive and reused over TLS as over TCP.
        public var tls: TransportTLSClientContext?
        /// Longest a new connection may take to resolve, connect and finish its TLS handshake (nil: no
        /// limit of its own); beyond it the connection ends as `.connectFailed`.
        public var connectTimeout: Double?

        public init(maxConnections: Int = 128, maxIdle: Int = 64, limits: HTTPWireLimits = HTTPWireLimits()) {
            self.maxConnections = max(1, maxConnections)
            self.maxIdle = max(0, maxIdle)
            self.limits = limits
        }
    }

    /// A place in the queue; `cancel()` gives it up (a client that went away while waiting).
    public final class Ticket {
        fileprivate var ready: ((Result<HTTPClientConnection, HTTPClientConnection.ConnectError>) -> Void)?
        fileprivate init(_ ready: @escaping (Result<HTTPClientConnection, HTTPClientConnection.ConnectError>) -> Void) {
            self.ready = ready
        }
        public func cancel() { ready = nil }
        public var isWaiting: Bool { ready != nil }
    }

    public let host: String
    public let port: UInt16
    public let settings: Settings
    public private(set) var openCount = 0
    public var idleCount: Int { idle.count }
    public var waitingCount: Int { waiters.filter(\.isWaiting).count }

    private let loop: TransportLoop
    private var idle: [HTTPClientConnection] = []
    private var waiters: [Ticket] = []
    private var waitersStart = 0

    public init(loop: TransportLoop, host: String, port: UInt16, settings: Settings = Settings()) {
        self.loop = loop
        self.host = host
        self.port = port
        self.settings = settings
    }

    /// Calls `ready` with a connection: before returning when one is idle or may be opened, later (from
    /// `release` or a close) when all are busy. The connection is the caller's until `release`.
    @discardableResult
    public func acquire(_ ready: @escaping (Result<HTTPClientConnection, HTTPClientConnection.ConnectError>) -> Void) -> Ticket {
        let ticket = Ticket(ready)
        if pendingWaiters == 0 {
            if let connection = takeIdle() {
                deliver(.success(connection), to: ticket)
                return ticket
            }
            if openCount < settings.maxConnections {
                deliver(open(), to: ticket)
                return ticket
            }
        }
        waiters.append(ticket)
        return ticket
    }

    /// Takes back a connection after its response. A reusable one goes to the first waiter or to the idle
    /// list; anything else is closed (which lets a waiter open a fresh one).
    public func release(_ connection: HTTPClientConnection) {
        connection.handler = nil
        guard connection.isReusable else {
            connection.close()
            return
        }
        if let ticket = nextWaiter() {
            deliver(.success(connection), to: ticket)
        } else if idle.count < settings.maxIdle {
            idle.append(connection)
        } else {
            connection.close()
        }
    }

    /// Closes idle connections and fails nobody: waiting tickets stay queued.
    public func closeIdle() {
        let closing = idle
        idle.removeAll()
        for connection in closing { connection.close() }
    }

    // MARK: -

    private var pendingWaiters: Int {
        while waitersStart < waiters.count, !waiters[waitersStart].isWaiting { waitersStart += 1 }
        compactWaiters()
        return waiters.count - waitersStart
    }

    private func nextWaiter() -> Ticket? {
        while waitersStart < waiters.count {
            let ticket = waiters[waitersStart]
            waitersStart += 1
            if ticket.isWaiting {
                compactWaiters()
                return ticket
            }
        }
        compactWaiters()
        return nil
    }

    /// Drops served tickets from the front once they are many (amortised O(1) per ticket).
    private func compactWaiters() {
        if waitersStart > 64 && waitersStart * 2 > waiters.count {
            waiters.removeFirst(waitersStart)
            waitersStart = 0
        } else if waitersStart == waiters.count {
            waiters.removeAll(keepingCapacity: true)
            waitersStart = 0
        }
    }

    /// The most recently used idle connection that is still usable (the upstream may have closed others).
    private func takeIdle() -> HTTPClientConnection? {
        while let connection = idle.popLast() {
            if connection.isReusable { return connection }
            connection.close()
        }
        return nil
    }

    private func open() -> Result<HTTPClientConnection, HTTPClientConnection.ConnectError> {
        do {
            let connection = try HTTPClientConnection(loop: loop, host: host, port: port, limits: settings.limits,
                                                      tls: settings.tls, connectTimeout: settings.connectTimeout)
            openCount += 1
            connection.onClosed = { [weak self, unowned connection] in self?.closed(connection) }
            return .success(connection)
        } catch {
            return .failure(error)
        }
    }

    private func closed(_ connection: HTTPClientConnection) {
        openCount -= 1
        idle.removeAll { $0 === connection }
        // A slot is free: the first waiter gets a fresh connection.
        if openCount < settings.maxConnections, let ticket = nextWaiter() {
            deliver(open(), to: ticket)
        }
    }

    private func deliver(_ result: Result<HTTPClientConnection, HTTPClientConnection.ConnectError>, to ticket: Ticket) {
        guard let ready = ticket.ready else {
            if case .success(let connection) = result { release(connection) }
            return
        }
        ticket.ready = nil
        ready(result)
    }
}
