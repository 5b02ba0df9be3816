import CLibevent
import Logging

/// The proxy listener's client connections: how many are open, which are idle, and the close callback
/// of each one. Keeps them within `limits.max_client_connections`.
///
/// evhttp 2.1 has no connection limit (`evhttp_set_max_connections` came after 2.1) and no hook that
/// sees an accepted connection. Two things it does have make counting exact:
/// - `evhttp_set_bevcb` runs once per accepted connection, to create its bufferevent, just before the
///   `evhttp_connection` exists;
/// - `evhttp_connection_free` calls the connection's close callback, and an incoming connection is only
///   ever freed, never reset, so that is exactly once (http.c of release-2.1.12, L1221–1230).
///
/// A new bufferevent is counted at once and adopted later in the same loop pass (`adoptEvent`). By then
/// evhttp has made its connection the bufferevent's callback argument, which is how we find it. No byte
/// from the client can have been read yet, because that needs another poll. So no request can arrive on a
/// connection before it is adopted. (Under memory exhaustion evhttp may free the connection before
/// adoption, or make its own bufferevent if ours could not be allocated; the count is then off by one.)
///
/// At the limit:
/// 1. A connection that has been *idle* for `idleGrace` is closed to make room. Idle means no request in
///    progress, no byte received since its last answer (or since accept), and nothing buffered either
///    way: evhttp consumes header lines and body chunks as it parses them, so only the byte-arrival
///    callback tells a half-received request from silence. A server may close an idle connection at any
///    time (RFC 9112 §9.5), and the grace avoids the moment a keep-alive client is most likely to send.
/// 2. Otherwise the newcomer *waits over the limit*, first come first served. It takes the next slot
///    that frees; while anyone waits, responses say `Connection: close` so that slots do free. If its
///    request arrives first and still nothing is idle, the request is answered 503 with `Retry-After`
///    and the connection is closed: an answer, not a hang.
/// 3. At most `overLimitAllowance` connections wait at once. Beyond that the listener stops accepting,
///    new connections wait in the kernel's listen backlog, and waiting connections that stay silent past
///    the grace are closed to let them in. This is the bound on file descriptors and memory.
/// A sweep runs every half grace while anyone waits or accepting is paused: time passing is what makes
/// a connection idle, and nothing else would notice it.
///
/// Confined to the event loop.
final class ClientConnections {
    /// One accepted connection. Its close and input callbacks point at this object, which the registry
    /// keeps alive until the close callback has run.
    final class Connection {
        fileprivate let handle: OpaquePointer
        fileprivate unowned let registry: ClientConnections
        fileprivate let sequence: UInt64
        fileprivate var isOverLimit = false
        /// Answered 503 for being over the limit; closing, never promoted.
        fileprivate var isRefused = false
        /// The exchange answering this connection's current request. The exchange detaches before it
        /// ends, so this strong reference never outlives the exchange's own self-retain.
        fileprivate var exchange: Exchange?
        fileprivate var quietSince = EventLoop.monotonicNow
        fileprivate var receivedSinceAnswer = false
        fileprivate var inputWatch: OpaquePointer?
        /// The request head now arriving: when its first byte came, and the end-of-head scan so far.
        fileprivate var head: HeadProgress?

        fileprivate init(handle: OpaquePointer, registry: ClientConnections, sequence: UInt64) {
            self.handle = handle
            self.registry = registry
            self.sequence = sequence
        }

        fileprivate var input: OpaquePointer? { bufferevent_get_input(evhttp_connection_get_bufferevent(handle)) }

        /// evhttp is freeing the connection (client hang-up, timeout, close after a response, our own abort).
        func closed() { registry.closed(self) }

        /// `count` bytes arrived from the client at `offset` of its input buffer (the buffer's callback,
        /// which runs before evhttp parses them).
        func received(offset: Int, count: Int) {
            receivedSinceAnswer = true
            quietSince = EventLoop.monotonicNow
            guard exchange == nil, let input else { return }
            if head == nil {
                head = HeadProgress(startedAt: quietSince)
                registry.headStarted()
            }
            if head?.isComplete == false { head?.scan(input, offset: offset, count: count) }
        }
    }

    enum Admission: Equatable {
        case admitted
        /// Every slot is taken by a connection that is not idle: answer 503 and close.
        case overLimit
        /// The head had a NUL byte (evhttp cut the field there): answer 400 and close.
        case nulInHead
        /// The head, counted with its request line and line endings, is over `limits.max_header_bytes`.
        case headTooLarge
    }

    /// How long a connection must have been silent before it may be closed to make room.
    static let idleGrace = 1.0
    /// How long a request head may take to arrive (`timeouts.client_header_seconds`); a reload may
    /// change it.
    var headTimeout: Double
    /// `limits.max_header_bytes`, counted over the whole head; a reload may change it.
    var maxHeadBytes: Int
    private var headTimer: LoopEvent?
    private var headTimerPending = false
    /// Warnings about the limit are repeated at most this often; the metrics count every event.
    private static let warningInterval = 10.0

    /// A reload may change it: a lower limit is reached as connections close (none is cut for it), a
    /// higher one lets waiting connections in as the next sweep or close looks.
    var maxConnections: Int {
        didSet { overLimitAllowance = Self.overLimitAllowance(for: maxConnections) }
    }
    /// How many connections may wait beyond `maxConnections` (accepted, then promoted or answered 503).
    private(set) var overLimitAllowance: Int
    private let metrics: RelayMetrics
    private let logger: Logger
    private var connections: [OpaquePointer: Connection] = [:]
    /// Bufferevents made for just-accepted connections whose `evhttp_connection` is not adopted yet.
    private var unadopted: [OpaquePointer] = []
    private var adoptEvent: LoopEvent!
    private var sweepTimer: LoopEvent?
    private var sweepPending = false
    private var withinLimit = 0
    private var overLimit = 0
    /// Over-limit connections not yet answered 503: they wait for a slot.
    private var waiting = 0
    private var nextSequence: UInt64 = 0
    private var accepting = true
    /// Set while closing an idle connection for a particular connection, so its slot goes to that one.
    private var makingRoom = false
    private var warnings = LogRateLimiter(interval: ClientConnections.warningInterval)
    /// Called with false to pause accepting, and with true to resume.
    var setAccepting: ((Bool) -> Void)?

    init(loop: EventLoop, maxConnections: Int, headTimeout: Double, maxHeadBytes: Int, metrics: RelayMetrics, logger: Logger) {
        self.maxConnections = maxConnections
        self.headTimeout = headTimeout
        self.maxHeadBytes = maxHeadBytes
        overLimitAllowance = Self.overLimitAllowance(for: maxConnections)
        self.metrics = metrics
        self.logger = logger
        adoptEvent = LoopEvent(loop: loop) { [unowned self] _ in self.adoptAccepted() }
        sweepTimer = LoopEvent(loop: loop) { [unowned self] _ in self.sweep() }
        headTimer = LoopEvent(loop: loop) { [unowned self] _ in self.closeSlowHeads() }
    }

    /// The allowance for connections waiting over the limit: an eighth of the limit, at least 16.
    static func overLimitAllowance(for maxConnections: Int) -> Int { max(16, maxConnections / 8) }

    /// Connections open now, counting the over-limit ones and those not adopted yet.
    var openCount: Int { withinLimit + overLimit + unadopted.count }

    /// While a connection waits for a slot, responses close their connection afterwards.
    var wantsSlotsBack: Bool { waiting > 0 }

    // MARK: - Accept and close (called from the bridge)

    /// evhttp accepted a connection and asks for its bufferevent (`evhttp_set_bevcb`).
    func bufferEventForAcceptedConnection(base: OpaquePointer?) -> OpaquePointer? {
        // Options 0, as evhttp uses when it makes the bufferevent itself: evhttp closes the socket.
        guard let bufferEvent = bufferevent_socket_new(base, -1, 0) else { return nil }
        unadopted.append(bufferEvent)
        adoptEvent.activate()
        // Stopping here also ends the listener's accept loop for this pass (listener.c checks `enabled`).
        updateAccepting()
        return bufferEvent
    }

    private func adoptAccepted() {
        // One at a time: adopting may close an idle connection, and the count must stay right meanwhile.
        while !unadopted.isEmpty {
            let bufferEvent = unadopted.removeFirst()
            var argument: UnsafeMutableRawPointer?
            bufferevent_getcb(bufferEvent, nil, nil, nil, &argument)
            if let argument { adopt(OpaquePointer(argument)) }
        }
        updateAccepting()
    }

    private func adopt(_ handle: OpaquePointer) {
        nextSequence += 1
        let connection = Connection(handle: handle, registry: self, sequence: nextSequence)
        connections[handle] = connection
        evhttp_connection_set_closecb(handle, clientConnectionClosedTrampoline, unretainedContext(connection))
        connection.inputWatch = evbuffer_add_cb(connection.input, clientBytesReceivedTrampoline, unretainedContext(connection))
        // Those already waiting come first; an idle slot goes to them in `sweep`.
        if withinLimit >= maxConnections && waiting == 0 { closeIdleConnection() }
        if withinLimit < maxConnections {
            withinLimit += 1
        } else {
            connection.isOverLimit = true
            overLimit += 1
            waiting += 1
            warn("over_limit", "client connection limit reached; new connections wait for a slot, or get 503")
            scheduleSweep()
        }
        recordOpen()
    }

    fileprivate func closed(_ connection: Connection) {
        guard connections.removeValue(forKey: connection.handle) != nil else { return }
        if let inputWatch = connection.inputWatch, let input = connection.input { evbuffer_remove_cb_entry(input, inputWatch) }
        connection.inputWatch = nil
        if connection.isOverLimit {
            overLimit -= 1
            if !connection.isRefused { waiting -= 1 }
        } else {
            withinLimit -= 1
            if !makingRoom { promoteLongestWaiting() }
        }
        recordOpen()
        if let exchange = connection.exchange {
            connection.exchange = nil
            exchange.clientConnectionClosed()
        }
        updateAccepting()
    }

    // MARK: - Requests (called by exchanges)

    /// A request arrived on `handle`; `exchange` answers it and is told if the connection closes first.
    func attach(_ exchange: Exchange, to handle: OpaquePointer) -> Admission {
        if connections[handle] == nil { adoptAccepted() }  // cannot happen (see the type's comment); cheap to be sure
        guard let connection = connections[handle] else { return .admitted }
        connection.exchange = exchange
        let head = connection.head
        connection.head = nil
        if head?.containsNUL == true { return .nulInHead }
        if let head, head.length > maxHeadBytes { return .headTooLarge }
        guard connection.isOverLimit else { return .admitted }
        // A request in hand proves a real client: a connection quiet for half the grace makes way for it
        // (the sweep that let this one in may have run a moment before the others reached the full grace).
        closeIdleConnection(grace: Self.idleGrace / 2)
        if withinLimit < maxConnections {
            promote(connection)
            return .admitted
        }
        connection.isRefused = true
        waiting -= 1
        metrics.countClientConnectionLimit(action: "refused")
        return .overLimit
    }

    /// The exchange on `handle` has answered (or given up) and no longer wants its close notice.
    func detach(from handle: OpaquePointer) {
        guard let connection = connections[handle] else { return }
        connection.exchange = nil
        connection.receivedSinceAnswer = false
        connection.quietSince = EventLoop.monotonicNow
        // Bytes of a pipelined next request may be buffered already: its head is timed from now, and
        // complete if it is all there.
        if let input = connection.input, EvBuffer.length(input) > 0 {
            var head = HeadProgress(startedAt: connection.quietSince)
            head.scan(input, offset: 0, count: EvBuffer.length(input))
            connection.head = head
            headStarted()
        }
    }

    // MARK: - Request heads (slowloris)

    fileprivate func headStarted() {
        guard !headTimerPending else { return }
        headTimerPending = true
        headTimer?.schedule(after: min(1, headTimeout / 2))
    }

    /// Closes connections whose request head has been arriving for longer than `headTimeout`. evhttp's own
    /// timeout restarts with every byte, so a client sending one byte a second would otherwise keep its
    /// connection (and a slot of the limit) for as long as it likes.
    private func closeSlowHeads() {
        headTimerPending = false
        let now = EventLoop.monotonicNow
        var pending = false
        for connection in Array(connections.values) {
            guard connection.exchange == nil, let head = connection.head, !head.isComplete else { continue }
            if now - head.startedAt >= headTimeout {
                metrics.countClientConnectionLimit(action: "closed_slow_head")
                warn("slow_head", "closed a client connection whose request head took longer than timeouts.client_header_seconds")
                evhttp_connection_free(connection.handle)  // calls `closed`
            } else {
                pending = true
            }
        }
        if pending { headStarted() }
    }

    // MARK: - Making room

    /// Closes the within-limit connection idle the longest, if any; its slot goes to the caller's
    /// connection (`makingRoom`).
    private func closeIdleConnection(grace: Double = ClientConnections.idleGrace) {
        let now = EventLoop.monotonicNow
        guard let idle = longestQuiet(now: now, grace: grace, where: { !$0.isOverLimit && Self.isIdle($0) }) else { return }
        metrics.countClientConnectionLimit(action: "closed_idle")
        makingRoom = true
        evhttp_connection_free(idle.handle)  // calls `closed`, which frees its slot
        makingRoom = false
    }

    private func longestQuiet(now: Double, grace: Double = ClientConnections.idleGrace, where condition: (Connection) -> Bool) -> Connection? {
        var found: Connection?
        for candidate in connections.values where now - candidate.quietSince >= grace && condition(candidate) {
            if found.map({ candidate.quietSince < $0.quietSince }) ?? true { found = candidate }
        }
        return found
    }

    private static func isIdle(_ connection: Connection) -> Bool {
        guard connection.exchange == nil, !connection.isRefused, !connection.receivedSinceAnswer else { return false }
        let bufferEvent = evhttp_connection_get_bufferevent(connection.handle)
        return EvBuffer.length(bufferevent_get_input(bufferEvent)) == 0 && EvBuffer.length(bufferevent_get_output(bufferEvent)) == 0
    }

    private func promoteLongestWaiting() {
        guard waiting > 0, withinLimit < maxConnections else { return }
        let oldest = connections.values.filter { $0.isOverLimit && !$0.isRefused }.min { $0.sequence < $1.sequence }
        if let oldest { promote(oldest) }
    }

    private func promote(_ connection: Connection) {
        connection.isOverLimit = false
        overLimit -= 1
        waiting -= 1
        withinLimit += 1
    }

    /// Runs while connections wait or accepting is paused: frees the slots that time has made idle.
    private func sweep() {
        sweepPending = false
        let now = EventLoop.monotonicNow
        while waiting > 0, withinLimit >= maxConnections, longestQuiet(now: now, where: { !$0.isOverLimit && Self.isIdle($0) }) != nil {
            closeIdleConnection()  // frees a slot
            promoteLongestWaiting()
        }
        // At the hard bound, waiting connections that have said nothing make way for the backlog.
        while !accepting, openCount >= maxConnections + overLimitAllowance,
              let silent = longestQuiet(now: now, where: { $0.isOverLimit && Self.isIdle($0) }) {
            metrics.countClientConnectionLimit(action: "closed_idle")
            evhttp_connection_free(silent.handle)
        }
        scheduleSweep()
    }

    private func scheduleSweep() {
        // Not re-armed while pending: a stream of arrivals would otherwise keep pushing it back.
        guard waiting > 0 || !accepting, !sweepPending else { return }
        sweepPending = true
        sweepTimer?.schedule(after: Self.idleGrace / 2)
    }

    private func updateAccepting() {
        let shouldAccept = openCount < maxConnections + overLimitAllowance
        guard shouldAccept != accepting else { return }
        accepting = shouldAccept
        if !shouldAccept {
            metrics.countClientConnectionLimit(action: "paused_accepting")
            warn("paused", "client connections at the hard bound; new connections wait in the listen backlog")
            scheduleSweep()
        }
        setAccepting?(shouldAccept)
    }

    private func recordOpen() {
        metrics.clientConnections.record(Double(withinLimit + overLimit))
    }

    /// Under a connection flood these would come once per connection; the metrics already count each.
    private func warn(_ key: String, _ message: Logger.Message) {
        guard warnings.admit(key, now: EventLoop.monotonicNow).allowed else { return }
        logger.warning(message, metadata: ["open": "\(openCount)", "max_client_connections": "\(maxConnections)"])
    }
}
