import HTTPWire

/// Connections to one upstream (a host name or an IP literal, plain or TLS), reused while `isReusable`, at most `maxConnections` open; when
/// all are busy, requests wait for the next free one instead of being refused. Every connection also takes a
/// slot of the pool's `UpstreamConnectionBudget`, which pools may share (a process-wide limit across routes);
/// a pool that could open one more but for a spent budget waits in the budget's line.
///
/// Waiting is in two lanes, each first come, first served:
/// - `.admitted`: requests that were admitted under another bound already (requests held during a token
///   refresh and released together). They are served before any newcomer and are never refused: a refresh
///   that releases a thousand held requests must not turn most of them into 503s.
/// - `.arriving`: new requests. At most `maxWaiters` of them wait; one more is refused at once
///   (`tooManyWaiters`), so the caller answers 503 while the client is still there to read it.
/// A wait can be bounded (`waitLimit`, failing with `waitTimedOut`) and given up (`Ticket.cancel()`, a
/// client that went away); either way the waiter is out of the count at once.
///
/// The pool only manages connections. What to do with a request whose connection failed (retry on a
/// fresh one, answer 502) is the caller's decision; `responseStarted` in the connection's end report
/// tells whether the upstream may have acted on it.
public final class UpstreamPool: UpstreamBudgetMember {
    public struct Settings: Sendable {
        public var maxConnections: Int
        /// Idle connections kept for reuse; more are closed when released.
        public var maxIdle: Int
        public var limits: HTTPWireLimits
        /// Requests of the `.arriving` lane that may wait for a connection (0: none may wait).
        public var maxWaiters: Int
        /// Seconds an unused connection is kept before it is closed (0: kept until the upstream closes
        /// it). Shorter than the upstream's own keep-alive timeout avoids sending on a connection the
        /// upstream is closing at the same moment.
        public var idleTimeout: Double
        /// TLS to the upstream (nil: plain TCP). Connections are kept alive and reused over TLS as over TCP.
        public var tls: TransportTLSClientContext?
        /// Longest a new connection may take to resolve, connect and finish its TLS handshake (nil: no
        /// limit of its own); beyond it the connection ends as `.connectFailed`.
        public var connectTimeout: Double?
        /// Protocols offered in ALPN over TLS (empty: none). With `h2` among them, a connection whose server
        /// selects h2 ends before its request (`HTTPClientConnection.serverSelectedHTTP2`).
        public var alpn: [String] = []

        public init(maxConnections: Int = 128, maxIdle: Int = 64, limits: HTTPWireLimits = HTTPWireLimits(),
                    maxWaiters: Int = 4096, idleTimeout: Double = 0) {
            self.maxConnections = max(1, maxConnections)
            self.maxIdle = max(0, maxIdle)
            self.limits = limits
            self.maxWaiters = max(0, maxWaiters)
            self.idleTimeout = idleTimeout.isFinite ? max(0, idleTimeout) : 0
        }
    }

    public enum Lane: Sendable {
        /// A new request: waits only while fewer than `maxWaiters` do.
        case arriving
        /// A request admitted earlier (released after a refresh): served first, never refused.
        case admitted
    }

    public enum AcquireFailure: Error, Equatable, Sendable, CustomStringConvertible {
        /// Opening a new connection failed at once.
        case connectFailed(String)
        /// Every connection is busy and `maxWaiters` requests of the arriving lane already wait.
        case tooManyWaiters
        /// The wait lasted `waitLimit` seconds.
        case waitTimedOut
        /// The pool was retired (a reload replaced it): it takes no new requests.
        case retired

        public var description: String {
            switch self {
            case .connectFailed(let reason): return reason
            case .tooManyWaiters: return "every upstream connection is busy and the wait queue is full"
            case .waitTimedOut: return "no upstream connection became free in time"
            case .retired: return "the upstream pool was replaced"
            }
        }
    }

    public typealias Grant = (Result<HTTPClientConnection, AcquireFailure>) -> Void

    /// A place in the queue; `cancel()` gives it up (a client that went away while waiting). Loop thread.
    public final class Ticket {
        fileprivate var ready: Grant?
        fileprivate let lane: Lane
        fileprivate let link: PoolLink
        fileprivate var timer: TransportTimer?

        fileprivate init(_ ready: @escaping Grant, lane: Lane, pool: UpstreamPool) {
            self.ready = ready
            self.lane = lane
            self.link = pool.link
        }

        /// Leaves the queue; the grant is never called afterwards. A no-op once it was called.
        public func cancel() {
            guard ready != nil else { return }
            ready = nil
            timer?.cancel()
            timer = nil
            link.pool?.left(lane)
        }

        public var isWaiting: Bool { ready != nil }
    }

    public let host: String
    public let port: UInt16
    /// A reload may change the limits: a higher `maxConnections` or `maxWaiters` applies to the next
    /// acquire and release, a lower one is reached as connections come back.
    public var settings: Settings
    public private(set) var openCount = 0
    public var idleCount: Int { idle.count }
    /// Connections out with a request (`openCount - idleCount`).
    public var busyCount: Int { openCount - idle.count }
    /// Requests waiting, both lanes.
    public var waitingCount: Int { waitingArriving + waitingAdmitted }
    public func waitingCount(_ lane: Lane) -> Int { lane == .arriving ? waitingArriving : waitingAdmitted }
    public private(set) var isRetired = false
    /// Called once when a retired pool has no connection left open and nobody waiting.
    public var onDrained: (() -> Void)?
    /// Told when an upstream sent bytes that belong to no response (a second response in one write, a body
    /// on a 304, anything while idle): that connection was closed, never reused. Worth a metric and a log
    /// line: it is a broken upstream or an attempt at response desync.
    public var onUnsolicitedBytes: ((Int) -> Void)?

    private let loop: TransportLoop
    /// What tickets and connections reach the pool through (see `PoolLink`).
    fileprivate let link = PoolLink()
    private var idle: [(connection: HTTPClientConnection, since: Double)] = []
    private var arriving = UpstreamWaitQueue()
    private var admitted = UpstreamWaitQueue()
    private var waitingArriving = 0
    private var waitingAdmitted = 0
    private var idleTimer: TransportTimer?
    /// The limit this pool shares with others (its own when none is given: no bound beyond `maxConnections`).
    public let budget: UpstreamConnectionBudget
    private let seat: UpstreamBudgetSeat

    public init(loop: TransportLoop, host: String, port: UInt16, settings: Settings = Settings(), budget: UpstreamConnectionBudget? = nil,
                budgetAccount: UpstreamBudgetAccount? = nil) {
        self.loop = loop
        seat = UpstreamBudgetSeat(account: budgetAccount)
        self.host = host
        self.port = port
        self.settings = settings
        self.budget = budget ?? .unbounded()
        link.pool = self
        seat.member = self
        self.budget.join(seat)
    }

    deinit {
        // Connections and tickets that outlive the pool report to nobody.
        link.pool = nil
        budget.leave(seat)
    }

    /// Calls `ready` with a connection: before returning when one is idle or may be opened, later (from
    /// `release`, a close, or the wait limit) when all are busy. A refusal (`tooManyWaiters`, `retired`)
    /// is also reported before returning. The connection is the caller's until `release`.
    @discardableResult
    public func acquire(lane: Lane, waitLimit: Double? = nil, _ ready: @escaping Grant) -> Ticket {
        let ticket = Ticket(ready, lane: lane, pool: self)
        if isRetired {
            deliver(.failure(.retired), to: ticket)
            return ticket
        }
        if waitingCount == 0 {
            if let connection = takeIdle() {
                deliver(.success(connection), to: ticket)
                return ticket
            }
            if openCount < settings.maxConnections && budget.take(seat) {
                deliver(open(), to: ticket)
                return ticket
            }
        }
        switch lane {
        case .arriving:
            guard waitingArriving < settings.maxWaiters else {
                deliver(.failure(.tooManyWaiters), to: ticket)
                return ticket
            }
            waitingArriving += 1
            arriving.append(ticket)
        case .admitted:
            waitingAdmitted += 1
            admitted.append(ticket)
        }
        if let waitLimit {
            let timer = TransportTimer(loop: loop) { [weak ticket] in
                guard let ticket, let ready = ticket.ready else { return }
                ticket.cancel()
                ready(.failure(.waitTimedOut))
            }
            timer.schedule(after: waitLimit)
            ticket.timer = timer
        }
        waitForBudgetIfBlocked()
        return ticket
    }

    /// An idle connection at once, when `acquire` would grant one before returning (the pool is not
    /// retired and nobody waits); nil otherwise, and the caller acquires as usual. The common case of a
    /// busy proxy without a ticket and a grant closure per request.
    public func takeIdleConnection() -> HTTPClientConnection? {
        guard !isRetired, waitingCount == 0 else { return nil }
        return takeIdle()
    }

    /// Like `acquire`, but never an idle connection: after a request failed on a reused connection the
    /// others idle beside it are likely as stale (the upstream restarted, or its keep-alive timeout ran out
    /// for all of them at once). A fresh one is opened if the limit allows (closing an idle one to make
    /// room), otherwise the caller waits like any other.
    @discardableResult
    public func acquireFresh(lane: Lane, waitLimit: Double? = nil, _ ready: @escaping Grant) -> Ticket {
        if !isRetired && (openCount >= settings.maxConnections || budget.inUse >= budget.limit), let stale = idle.popLast() {
            stale.connection.close()
        }
        if !isRetired && openCount < settings.maxConnections && budget.take(seat) {
            let ticket = Ticket(ready, lane: lane, pool: self)
            deliver(open(), to: ticket)
            return ticket
        }
        return acquire(lane: lane, waitLimit: waitLimit, ready)
    }

    /// The earlier form: the `.admitted` lane (never refused, no wait limit), failures as `ConnectError`.
    @discardableResult
    public func acquire(_ ready: @escaping (Result<HTTPClientConnection, HTTPClientConnection.ConnectError>) -> Void) -> Ticket {
        acquire(lane: .admitted) { result in
            ready(result.mapError { HTTPClientConnection.ConnectError(description: $0.description) })
        }
    }

    /// Takes back a connection after its response. A reusable one goes to the first waiter or to the idle
    /// list; anything else is closed (which lets a waiter open a fresh one). A retired pool closes it
    /// unless someone queued before the retirement still waits.
    public func release(_ connection: HTTPClientConnection) {
        connection.handler = nil
        guard connection.isReusable else {
            connection.close()
            return
        }
        if budget.hasWaitingPools { return releaseWhileOthersWait(connection) }
        if let ticket = nextWaiter() {
            deliver(.success(connection), to: ticket)
        } else if !isRetired && idle.count < settings.maxIdle && openCount <= settings.maxConnections {
            idle.append((connection, monotonicSeconds()))
            scheduleIdleCheck()
        } else {
            connection.close()
        }
    }

    /// The budget is spent and pools wait in its line. If another pool is first, the connection closes and
    /// its slot goes there; if this pool is, its first waiter reuses the connection and the pool goes to the
    /// back of the line (see `UpstreamConnectionBudget` for the starvation either prevents).
    private func releaseWhileOthersWait(_ connection: HTTPClientConnection) {
        if !budget.isWaitedFor(by: seat), let ticket = nextWaiter() {
            budget.servedInLine(seat)
            if waitingCount == 0 { budget.leaveLine(seat) }
            deliver(.success(connection), to: ticket)
        } else {
            connection.close()
        }
    }

    /// Closes idle connections and fails nobody: waiting tickets stay queued.
    public func closeIdle() {
        let closing = idle
        idle.removeAll()
        idleTimer?.cancel()
        for entry in closing { entry.connection.close() }
    }

    /// After a reload replaced this pool: no new requests (`retired`), idle connections closed now, busy
    /// ones closed when released. Requests already waiting are still served. `onDrained` tells when
    /// nothing is left.
    public func retire() {
        guard !isRetired else { return }
        isRetired = true
        closeIdle()
        checkDrained()
    }

    // MARK: -

    fileprivate func left(_ lane: Lane) {
        switch lane {
        case .arriving:
            waitingArriving -= 1
            arriving.pruneIfSparse(waiting: waitingArriving)
        case .admitted:
            waitingAdmitted -= 1
            admitted.pruneIfSparse(waiting: waitingAdmitted)
        }
        if waitingCount == 0 { budget.leaveLine(seat) }
        checkDrained()
    }

    /// The first waiting ticket: the admitted lane before the arriving one. It is out of the count.
    private func nextWaiter() -> Ticket? {
        if let ticket = admitted.popWaiting() {
            waitingAdmitted -= 1
            return ticket
        }
        if let ticket = arriving.popWaiting() {
            waitingArriving -= 1
            return ticket
        }
        return nil
    }

    /// The most recently used idle connection that is still usable (the upstream may have closed others).
    private func takeIdle() -> HTTPClientConnection? {
        while let entry = idle.popLast() {
            if entry.connection.isReusable { return entry.connection }
            entry.connection.close()
        }
        return nil
    }

    /// Opens a connection on a budget slot the caller took (`take`, or an offer); a failure gives it back.
    private func open() -> Result<HTTPClientConnection, AcquireFailure> {
        do {
            let connection = try HTTPClientConnection(loop: loop, host: host, port: port, limits: settings.limits,
                                                      tls: settings.tls, connectTimeout: settings.connectTimeout, alpn: settings.alpn)
            openCount += 1
            // After the pool is gone (a connection out with a request outlives it), the slot still goes back.
            connection.onClosed = { [link, budget, account = seat.account, unowned connection] in
                if let pool = link.pool { pool.closed(connection) } else { budget.giveBack(account) }
            }
            connection.onUnsolicitedBytes = { [link] count in link.pool?.onUnsolicitedBytes?(count) }
            return .success(connection)
        } catch {
            budget.giveBack(seat.account)
            return .failure(.connectFailed(error.description))
        }
    }

    private func closed(_ connection: HTTPClientConnection) {
        openCount -= 1
        idle.removeAll { $0.connection === connection }
        // A slot is free, in the pool and in the budget: it goes to the pool first in line, and this pool's
        // waiters queue behind those that waited longer (first in line at once when nobody else waits).
        budget.giveBack(seat.account)
        waitForBudgetIfBlocked()
        checkDrained()
    }

    /// Waiters this pool could open a connection for but for the budget: the pool queues there.
    private func waitForBudgetIfBlocked() {
        guard waitingCount > 0, openCount < settings.maxConnections, idle.isEmpty else { return }
        budget.wait(seat)
    }

    private func deliver(_ result: Result<HTTPClientConnection, AcquireFailure>, to ticket: Ticket) {
        guard let ready = ticket.ready else {
            if case .success(let connection) = result { release(connection) }
            return
        }
        ticket.ready = nil
        ticket.timer?.cancel()
        ticket.timer = nil
        ready(result)
    }

    private func checkDrained() {
        guard isRetired, openCount == 0, waitingCount == 0, let drained = onDrained else { return }
        onDrained = nil
        drained()
    }

    // MARK: - Idle timeout

    var oldestIdleSince: Double? { idle.first?.since }

    func closeOldestIdle() {
        guard !idle.isEmpty else { return }
        idle.removeFirst().connection.close()
    }

    func budgetOffersSlot() {
        guard openCount < settings.maxConnections, let ticket = nextWaiter() else { return }
        budget.takeOffered(seat)
        deliver(open(), to: ticket)
        waitForBudgetIfBlocked()
    }

    private func scheduleIdleCheck() {
        guard settings.idleTimeout > 0, let oldest = idle.first else { return }
        // Unowned: the pool owns the timer, whose deinit makes sure it never fires afterwards.
        if idleTimer == nil { idleTimer = TransportTimer(loop: loop) { [unowned self] in self.closeExpiredIdle() } }
        guard let idleTimer, !idleTimer.isScheduled else { return }
        idleTimer.schedule(after: oldest.since + settings.idleTimeout - monotonicSeconds())
    }

    /// Closes connections idle for `idleTimeout` (the oldest are at the front: `takeIdle` reuses the
    /// most recent), then waits for the next to expire.
    private func closeExpiredIdle() {
        let now = monotonicSeconds()
        while let oldest = idle.first, now - oldest.since >= settings.idleTimeout {
            idle.removeFirst()
            oldest.connection.close()
        }
        scheduleIdleCheck()
    }
}
