/// HTTP/2 connections to one upstream, each carrying many streams: a request gets a stream on a
/// connection below the server's SETTINGS_MAX_CONCURRENT_STREAMS (and ours), and another connection is
/// opened (up to `maxConnections`) only when every one is full. Requests that find no room wait, in the
/// two lanes of `UpstreamPool` (`.admitted` first, never refused; `.arriving` bounded by `maxWaiters`).
///
/// A connection takes streams only once the server's first SETTINGS arrived: until then its limit is
/// not known, and a burst handed to a connection that then allows 2 would wait there instead of
/// opening more. While one connection is being opened, no second one is started for the same waiters.
/// A connection that received GOAWAY takes no new stream; the ones it did not process fail
/// `.notProcessed` (the caller sends them again, they get a stream elsewhere).
///
/// Each connection takes a slot of the pool's `UpstreamConnectionBudget`, as in `UpstreamPool`: a pool
/// that needs one more connection while the budget is spent waits in its line. A connection with no
/// stream is idle: another pool may have it closed for its slot. While another pool is first in line, a
/// stream ending makes its connection yield (`yielding`: no new stream, closed after its last), so its
/// slot goes there; no stream in flight is cut for it. No GOAWAY is sent for that: some servers stop
/// answering the streams they have once they receive one.
public final class HTTP2UpstreamPool {
    public struct Settings: Sendable {
        public var maxConnections: Int
        public var maxWaiters: Int
        public var tls: TransportTLSClientContext?
        public var connectTimeout: Double?
        /// Seconds a connection with no stream is kept (0: until the upstream closes it).
        public var idleTimeout: Double
        public var connection: HTTP2ClientConnection.Settings
        /// Over TLS: let the server choose HTTP/1.1 in ALPN (`upstream.http2` "alpn").
        public var http1Allowed = false

        public init(maxConnections: Int = 128, maxWaiters: Int = 4096, idleTimeout: Double = 0,
                    connection: HTTP2ClientConnection.Settings = .init()) {
            self.maxConnections = max(1, maxConnections)
            self.maxWaiters = max(0, maxWaiters)
            self.idleTimeout = idleTimeout.isFinite ? max(0, idleTimeout) : 0
            self.connection = connection
        }
    }

    public typealias Grant = (Result<HTTP2ClientStream, UpstreamPool.AcquireFailure>) -> Void

    /// A place in the queue; `cancel()` leaves it (the grant is not called afterwards).
    public final class Ticket {
        fileprivate var ready: Grant?
        fileprivate let lane: UpstreamPool.Lane
        fileprivate weak var pool: HTTP2UpstreamPool?

        fileprivate init(_ ready: @escaping Grant, lane: UpstreamPool.Lane, pool: HTTP2UpstreamPool) {
            self.ready = ready
            self.lane = lane
            self.pool = pool
        }

        public func cancel() {
            guard ready != nil else { return }
            ready = nil
            pool?.left(self)
        }

        public var isWaiting: Bool { ready != nil }
    }

    public let host: String
    public let port: UInt16
    public var settings: Settings
    private let loop: TransportLoop
    private var connections: [HTTP2ClientConnection] = []
    private var admitted: [Ticket] = []
    private var arriving: [Ticket] = []
    private var idleTimer: TransportTimer?
    public private(set) var isRetired = false
    /// The server selected HTTP/1.1 in ALPN: requests go to the HTTP/1.1 pool (the caller's choice; this
    /// pool refuses them with `connectFailed`) until it is asked again: `serverMaySpeakHTTP2` (an HTTP/1.1
    /// connection found h2 selected) or `askAgain` (a call that needs HTTP/2).
    public private(set) var serverChoseHTTP1 = false {
        didSet { if serverChoseHTTP1 { choseHTTP1At = monotonicSeconds() } }
    }
    private var choseHTTP1At = 0.0
    /// Connections opened over the pool's life (a test's or a metric's look).
    public private(set) var connectionsOpened = 0
    public var openCount: Int { connections.count }
    public var waitingCount: Int { admitted.count + arriving.count }

    /// The limit this pool shares with others (its own when none is given: no bound beyond `maxConnections`).
    public let budget: UpstreamConnectionBudget
    private let seat: UpstreamBudgetSeat

    public init(loop: TransportLoop, host: String, port: UInt16, settings: Settings, budget: UpstreamConnectionBudget? = nil,
                budgetAccount: UpstreamBudgetAccount? = nil) {
        self.loop = loop
        seat = UpstreamBudgetSeat(account: budgetAccount)
        self.host = host
        self.port = port
        self.settings = settings
        self.budget = budget ?? .unbounded()
        seat.member = self
        self.budget.join(seat)
    }

    deinit {
        budget.leave(seat)
        for connection in connections {
            connection.onReady = nil
            connection.onStreamClosed = nil
            // Still open: its slot goes back when it closes.
            connection.onClosed = { [budget, account = seat.account] in budget.giveBack(account) }
        }
    }

    /// Calls `ready` with a stream (before returning when a connection has room), or a failure.
    @discardableResult
    public func acquire(lane: UpstreamPool.Lane, _ ready: @escaping Grant) -> Ticket {
        let ticket = Ticket(ready, lane: lane, pool: self)
        if isRetired || serverChoseHTTP1 {
            ticket.ready = nil
            ready(.failure(isRetired ? .retired : .connectFailed("the upstream speaks HTTP/1.1")))
            return ticket
        }
        if waitingCount == 0, let connection = connections.first(where: takesStreams) {
            ticket.ready = nil
            ready(.success(connection.makeStream()))
            return ticket
        }
        if lane == .arriving && arriving.count >= settings.maxWaiters {
            ticket.ready = nil
            ready(.failure(.tooManyWaiters))
            return ticket
        }
        if lane == .admitted { admitted.append(ticket) } else { arriving.append(ticket) }
        pump()
        return ticket
    }

    /// A new HTTP/1.1 connection to the upstream found h2 selected in ALPN: the server changed, requests come
    /// here again (the next connection learns anew).
    public func serverMaySpeakHTTP2() { serverChoseHTTP1 = false }

    /// For a request that only HTTP/2 can carry (gRPC) while the server is known to choose HTTP/1.1: the
    /// next connection asks the server again if the last answer is at least `seconds` old, so that a client
    /// that sends nothing else (which would open no HTTP/1.1 connection to learn from) is not refused for
    /// ever after a redeploy, while a flood of such calls costs at most one handshake per `seconds`.
    /// Returns whether requests come here now.
    public func askAgain(notSooner seconds: Double) -> Bool {
        if serverChoseHTTP1 && monotonicSeconds() - choseHTTP1At >= seconds { serverChoseHTTP1 = false }
        return !serverChoseHTTP1
    }

    /// No new requests; connections close as their streams end.
    public func retire() {
        guard !isRetired else { return }
        isRetired = true
        for connection in connections where connection.activeStreams == 0 { connection.close() }
    }

    // MARK: -

    fileprivate func left(_ ticket: Ticket) {
        admitted.removeAll { $0 === ticket }
        arriving.removeAll { $0 === ticket }
        if waitingCount == 0 { budget.leaveLine(seat) }
    }

    private func nextWaiter() -> Ticket? {
        if !admitted.isEmpty { return admitted.removeFirst() }
        if !arriving.isEmpty { return arriving.removeFirst() }
        return nil
    }

    /// Hands streams to waiters while a connection has room; opens one more connection when waiters are
    /// left and none is on its way up.
    private func pump() {
        while waitingCount > 0, let connection = connections.first(where: takesStreams) {
            guard let ticket = nextWaiter(), let ready = ticket.ready else { continue }
            ticket.ready = nil
            ready(.success(connection.makeStream()))
        }
        guard waitingCount > 0, !isRetired else {
            budget.leaveLine(seat)
            return scheduleIdleCheck()
        }
        let opening = connections.contains { !$0.isReady && !$0.isClosed }
        // A server whose SETTINGS allow no stream now (SETTINGS_MAX_CONCURRENT_STREAMS 0, legal) would say
        // the same on every connection: the waiters wait on the one it has (bounded by their pool wait)
        // instead of each pump opening another, up to `maxConnections` connections for one request.
        let refusingStreams = connections.contains { $0.isReady && !$0.isGoingAway && !$0.isClosed && $0.peerMaxStreams == 0 }
        guard !opening && !refusingStreams && connections.count < settings.maxConnections else { return }
        if offered {
            offered = false
            budget.takeOffered(seat)
            open()
        } else if budget.take(seat) {
            open()
        } else {
            budget.wait(seat)
        }
    }

    /// Connections that take no new stream and close after their last: their slot goes to another pool.
    private var yielding: Set<ObjectIdentifier> = []

    /// Whether a new stream may go on `connection` (it has room and is not yielding its slot).
    private func takesStreams(_ connection: HTTP2ClientConnection) -> Bool {
        connection.hasRoom && (yielding.isEmpty || !yielding.contains(ObjectIdentifier(connection)))
    }

    /// Set while the budget offers this pool a slot (`budgetOffersSlot`): `pump` may take it although
    /// other pools are in line.
    private var offered = false

    func budgetOffersSlot() {
        offered = true
        pump()
        offered = false
    }

    var oldestIdleSince: Double? {
        connections.lazy.filter(\.isUnused).map(\.lastUsed).min()
    }

    func closeOldestIdle() {
        guard let oldest = connections.filter(\.isUnused).min(by: { $0.lastUsed < $1.lastUsed }) else { return }
        oldest.drain()
        oldest.close()
    }

    /// Opens a connection on a budget slot `pump` took; its close gives the slot back.
    private func open() {
        let connection = HTTP2ClientConnection(loop: loop, host: host, port: port, tls: settings.tls,
                                               connectTimeout: settings.connectTimeout, settings: settings.connection,
                                               http1Allowed: settings.http1Allowed)
        connectionsOpened += 1
        connections.append(connection)
        connection.onReady = { [weak self] in self?.pump() }
        connection.onStreamClosed = { [weak self, unowned connection] in
            guard let self else { return }
            // Another pool is first in line for the budget: the connection goes, for its slot, at once if it
            // carries nothing, else after its last stream. Were it only closed when idle, a route whose
            // streams overlap without pause would keep its slots for ever and the other route's requests
            // would wait until their pool wait answered 503. This pool's next requests queue for a slot.
            if self.budget.isWaitedFor(by: self.seat) && !connection.isClosed && connection.activeStreams > 0 {
                self.yielding.insert(ObjectIdentifier(connection))
            }
            if (self.isRetired || self.budget.isWaitedFor(by: self.seat) || self.yielding.contains(ObjectIdentifier(connection)))
                && connection.activeStreams == 0 {
                connection.close()
            }
            self.pump()
        }
        connection.onClosed = { [weak self, unowned connection] in self?.closed(connection) }
    }

    private func closed(_ connection: HTTP2ClientConnection) {
        connections.removeAll { $0 === connection }
        if !yielding.isEmpty { yielding.remove(ObjectIdentifier(connection)) }
        // Last: the waiters of a connection that never came up are answered on it first.
        defer { budget.giveBack(seat.account) }
        if connection.serverChoseHTTP1 { serverChoseHTTP1 = true }
        if !connection.isReady && connection.connectFailure != nil && !connection.serverChoseHTTP1 {
            // The waiters were waiting for this connection: each gets a stream on it, which fails as its
            // request starts (`.connectFailed`), as an HTTP/1.1 request fails on a connection that never
            // came up; the request machine decides whether to try once more.
            while let ticket = nextWaiter() {
                guard let ready = ticket.ready else { continue }
                ticket.ready = nil
                ready(.success(connection.makeStream()))
            }
            return
        }
        if connection.serverChoseHTTP1 { return failWaiters(.connectFailed("the upstream speaks HTTP/1.1")) }
        pump()
    }

    private func failWaiters(_ failure: UpstreamPool.AcquireFailure) {
        while let ticket = nextWaiter() {
            guard let ready = ticket.ready else { continue }
            ticket.ready = nil
            ready(.failure(failure))
        }
    }

    // MARK: - Idle connections

    private func scheduleIdleCheck() {
        guard settings.idleTimeout > 0, connections.contains(where: { $0.activeStreams == 0 }) else { return }
        if idleTimer == nil { idleTimer = TransportTimer(loop: loop) { [unowned self] in self.closeIdle() } }
        guard let idleTimer, !idleTimer.isScheduled else { return }
        idleTimer.schedule(after: settings.idleTimeout)
    }

    private func closeIdle() {
        let now = monotonicSeconds()
        for connection in connections where connection.activeStreams == 0 && now - connection.lastUsed >= settings.idleTimeout {
            connection.drain()
            connection.close()
        }
        scheduleIdleCheck()
    }
}

extension HTTP2UpstreamPool: UpstreamBudgetMember {}

private extension HTTP2ClientConnection {
    /// Up, carrying no stream, and not on its way out.
    var isUnused: Bool { isReady && !isClosed && !isGoingAway && activeStreams == 0 }
}
