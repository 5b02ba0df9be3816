import CLibevent
import CTransportSocket
import HTTPWire
import Glibc

/// A listening socket whose accepted connections become `HTTPServerConnection`s.
///
/// The server accepts itself (no evconnlistener): the peer address comes with `accept4`, sockets are
/// non-blocking and close-on-exec from the start, and the number of open connections is exact.
///
/// The connection limit (`Settings.maxConnections`):
/// 1. At the limit, a connection that has been *idle* (no request in progress, nothing buffered either
///    way) for `idleGrace` is closed to make room. A server may close an idle connection at any time
///    (RFC 9112 section 9.5); the grace avoids the moment a keep-alive client is most likely to send.
///    If none is idle, the connection whose request head began arriving longest ago (more than the grace,
///    still incomplete) is answered 408 and closed instead: real clients send a head at once, and heads
///    trickled within the head timeout must not hold every slot.
/// 2. Otherwise the newcomer is accepted *over the limit* and waits, first come first served, for the
///    next slot that frees; while anyone waits, responses say `Connection: close` so that slots do free.
///    If its request head arrives first and still nothing is idle, the transport answers it with
///    `Settings.overLimitResponse` (503) and closes: the request never reaches the handler.
/// 3. At most `overLimitAllowance` connections wait at once. Beyond that the server stops accepting (new
///    connections stay in the kernel's listen backlog) and waiting connections that stay silent past the
///    grace, or trickle a head past it, are closed to let them in. This bounds descriptors and memory.
/// A sweep runs every half grace while anyone waits or accepting is paused: time passing is what makes a
/// connection idle, and nothing else would notice it. Every action is reported through `onLimitEvent`.
public final class HTTPServer {
    public struct ListenError: Error, CustomStringConvertible {
        public let description: String
    }

    /// Limits and timeouts. Changing `HTTPServer.settings` (a configuration reload) applies the limits at
    /// once and the rest to connections accepted afterwards.
    public struct Settings: Sendable {
        public var limits: HTTPWireLimits
        /// Open client connections within the limit; 0: no limit.
        public var maxConnections: Int
        /// Connections that may wait over the limit; nil: an eighth of the limit, at least 16.
        public var overLimitAllowance: Int?
        /// How long a connection must have been quiet before it may be closed to make room.
        public var idleGrace: Double
        /// Seconds a request head may take from its first byte to its last (0: unbounded).
        public var headTimeout: Double
        /// Seconds a keep-alive connection may wait for its next request (from accept, or from the end of
        /// the last response) before it is closed without an answer (0: unbounded).
        public var idleTimeout: Double
        /// Seconds a request body may pause between two reads (0: unbounded). A stalled body is answered
        /// 408 (if no response has started) and the connection closes. Time while the handler has paused
        /// reading does not count.
        public var bodyTimeout: Double
        /// Seconds a response may wait with the client taking none of it (a client that stopped reading)
        /// before the connection is closed (0: unbounded). Any byte taken restarts it.
        public var sendTimeout: Double
        /// A hard cap on request bodies (0: none). A larger `Content-Length` is answered 413 before any
        /// body byte is read; a chunked body that grows past it is answered 413 (or closed, if a response
        /// has started) when it does. The product streams large bodies, so it leaves this at 0.
        public var maxBodyBytes: Int
        /// What an over-limit connection's request gets (`Connection: close` is added).
        public var overLimitResponse: HTTPResponseHead
        public var overLimitBody: [UInt8]
        /// Read buffer per connection (at least the head limit).
        public var inputCapacity: Int
        /// A newcomer never waits behind a connection that says nothing: at the limit the connection quiet
        /// the longest (idle, or trickling a head) is closed for it at once, with no grace, and at the
        /// limit plus the allowance one is closed instead of accepting pausing. For a port whose clients
        /// send their request the moment they connect (the admin port's probes): there, a flood of silent
        /// or slow connections that keeps reconnecting would otherwise fill the listen backlog ahead of
        /// the probe, and the probe would time out before it is even accepted. Only connections accepted
        /// before the current accept batch are closed on arrival, so each has had a loop turn to send.
        public var evictsQuietAtOnce = false

        public init(limits: HTTPWireLimits = HTTPWireLimits(), maxConnections: Int = 0, overLimitAllowance: Int? = nil,
                    idleGrace: Double = 1, headTimeout: Double = 10, idleTimeout: Double = 60, bodyTimeout: Double = 60,
                    sendTimeout: Double = 60, maxBodyBytes: Int = 0,
                    overLimitResponse: HTTPResponseHead = HTTPResponseHead(status: 503, reason: "Service Unavailable",
                                                                           fields: [("Content-Type", "text/plain"), ("Retry-After", "1")]),
                    overLimitBody: [UInt8] = Array("too many client connections\n".utf8),
                    inputCapacity: Int = 64 * 1024) {
            self.limits = limits
            self.maxConnections = maxConnections
            self.overLimitAllowance = overLimitAllowance
            self.idleGrace = idleGrace
            self.headTimeout = headTimeout
            self.idleTimeout = idleTimeout
            self.bodyTimeout = bodyTimeout
            self.sendTimeout = sendTimeout
            self.maxBodyBytes = maxBodyBytes
            self.overLimitResponse = overLimitResponse
            self.overLimitBody = overLimitBody
            self.inputCapacity = inputCapacity
        }

        /// The allowance in effect.
        public var effectiveOverLimitAllowance: Int { max(0, overLimitAllowance ?? max(16, maxConnections / 8)) }
    }

    /// What the connection limit made the server do (for a metric and a rate-limited warning).
    public enum LimitEvent: Sendable, Equatable {
        /// A connection was accepted over the limit; it waits for a slot.
        case acceptedOverLimit
        /// An over-limit connection's request was answered with `overLimitResponse` and closed.
        case refused
        /// An idle connection was closed to make room.
        case closedIdle
        /// A connection whose request head had been trickling in for longer than the grace was answered
        /// 408 and closed to make room (no connection was idle).
        case closedStalledHead
        /// At the limit plus the allowance: new connections wait in the listen backlog.
        case pausedAccepting
    }

    public let port: UInt16
    /// Open connections, those waiting over the limit included (until their socket is closed).
    public var openConnections: Int { connections.count }
    /// Over-limit connections waiting for a slot.
    public private(set) var waitingConnections = 0
    public private(set) var isAccepting = true
    /// Told of every action at the connection limit (loop thread).
    public var onLimitEvent: ((LimitEvent) -> Void)?
    /// Assign on the loop thread (a reload): the connection limit applies at once, the rest to
    /// connections accepted afterwards.
    public var settings: Settings {
        didSet {
            connectionSettings = nil
            limitsChanged()
        }
    }
    /// What connections accepted under the current `settings` keep, one object shared by all of them.
    private var connectionSettings: HTTPServerConnection.FixedSettings?

    private let loop: TransportLoop
    private let fd: Int32
    private var acceptEvent: OpaquePointer?
    /// Called with each accepted connection (settable after init, for owners that create the server in theirs).
    public var onConnection: (HTTPServerConnection) -> Void
    private var connections: [ObjectIdentifier: HTTPServerConnection] = [:]
    private var withinLimit = 0
    private var overLimit = 0
    private var nextSequence: UInt64 = 0
    /// Set while closing an idle connection for a particular newcomer, so its slot goes to that one.
    private var makingRoom = false
    /// The sequence of the first connection of the accept batch under way (see `evictsQuietAtOnce`).
    private var batchStart: UInt64 = .max
    private var sweepTimer: TransportTimer?

    /// Listens on an IP address literal ("127.0.0.1", "0.0.0.0", "::1", "[::]") or a host name (resolved
    /// once, here); port 0 picks a free port (see `port`).
    /// `headTimeout`: seconds a request head may take from its first byte to its last (0: unbounded).
    public convenience init(loop: TransportLoop, host: String, port: UInt16, backlog: Int32 = 511, limits: HTTPWireLimits = HTTPWireLimits(),
                            inputCapacity: Int = 64 * 1024, headTimeout: Double = 10,
                            onConnection: @escaping (HTTPServerConnection) -> Void) throws(ListenError) {
        try self.init(loop: loop, host: host, port: port, backlog: backlog,
                      settings: Settings(limits: limits, headTimeout: headTimeout, inputCapacity: inputCapacity),
                      onConnection: onConnection)
    }

    public init(loop: TransportLoop, host: String, port: UInt16, backlog: Int32 = 511, settings: Settings,
                onConnection: @escaping (HTTPServerConnection) -> Void) throws(ListenError) {
        self.loop = loop
        self.settings = settings
        self.onConnection = onConnection
        let addresses = try Self.listenAddresses(host: host, port: port)
        // The name's addresses in the resolver's order; the first that binds is the listener.
        var listening: Int32 = -1
        var lastFailure = "no address to listen on"
        for address in addresses {
            let candidate = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard candidate >= 0 else {
                lastFailure = "socket: \(String(cString: strerror(errno)))"
                continue
            }
            var one: Int32 = 1
            setsockopt(candidate, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
            if address.withSockaddr({ bind(candidate, $0, $1) }) == 0 && listen(candidate, backlog) == 0 {
                listening = candidate
                break
            }
            lastFailure = String(cString: strerror(errno))
            Glibc.close(candidate)
        }
        guard listening >= 0 else { throw ListenError(description: "\(host):\(port): \(lastFailure)") }
        let fd = listening
        var actual = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        self.port = PeerAddress(&actual)?.port ?? port
        self.fd = fd
        acceptEvent = event_new(loop.base, fd, Int16(EV_READ | EV_PERSIST), serverAcceptTrampoline, Unmanaged.passUnretained(self).toOpaque())
        event_add(acceptEvent, nil)
        // Unowned: the server owns the timer, whose deinit makes sure it never fires afterwards (a weak
        // capture would give the server a side table, slowing every retain of it).
        sweepTimer = TransportTimer(loop: loop) { [unowned self] in self.sweep() }
    }

    /// An IP literal as it is; a name (`localhost`, the host's own name) through the system resolver.
    /// Blocking, but a listener is made once, at start, before the loop serves
    /// (a hosts-file name answers at once; the config check accepts names, so start must too).
    private static func listenAddresses(host: String, port: UInt16) throws(ListenError) -> [SocketAddress] {
        if let literal = SocketAddress(host: host, port: port) { return [literal] }
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE
        var list: UnsafeMutablePointer<addrinfo>?
        let result = getaddrinfo(host, String(port), &hints, &list)
        guard result == 0 else {
            throw ListenError(description: "\(host):\(port): cannot resolve \(host): \(String(cString: gai_strerror(result)))")
        }
        defer { freeaddrinfo(list) }
        let addresses = SocketAddress.all(in: list)
        guard !addresses.isEmpty else { throw ListenError(description: "\(host):\(port): \(host) has no IPv4 or IPv6 address") }
        return addresses
    }

    func acceptReady() {
        // Several connections may be waiting; take a bounded batch so one busy listener cannot starve the
        // connections already open.
        batchStart = nextSequence + 1
        for _ in 0..<64 {
            guard isAccepting, acceptEvent != nil else { return }
            // Nothing from this batch quiet enough to close: the level-triggered event fires again after
            // this turn's reads, when this batch's connections have had their chance to send.
            if settings.evictsQuietAtOnce, hasLimit, openConnections >= hardBound, !closeQuietest(acceptedBefore: batchStart) { return }
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let client = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    transport_accept_nonblocking(fd, $0, &length)
                }
            }
            if client < 0 {
                // EAGAIN: none left. EMFILE/ENFILE/ENOBUFS: the connection stays in the backlog until a
                // descriptor frees; the level-triggered event retries then.
                return
            }
            var one: Int32 = 1
            setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            guard let peer = PeerAddress(&storage) else {
                Glibc.close(client)
                continue
            }
            nextSequence += 1
            let fixed = connectionSettings ?? HTTPServerConnection.FixedSettings(settings)
            connectionSettings = fixed
            let connection = HTTPServerConnection(loop: loop, fd: client, peer: peer, settings: settings, fixed: fixed, sequence: nextSequence)
            let id = ObjectIdentifier(connection)
            connections[id] = connection
            connection.server = self
            admit(connection)
            onConnection(connection)
            updateAccepting()
        }
    }

    /// Stops accepting (the listening socket is closed, so new clients are refused by the kernel); open
    /// connections carry on.
    public func stopAccepting() {
        if let acceptEvent {
            event_free(acceptEvent)
            self.acceptEvent = nil
            Glibc.close(fd)
        }
    }

    /// Stops accepting and closes every open connection.
    public func close() {
        stopAccepting()
        sweepTimer?.cancel()
        // Each connection forgets the server first: it must not report back (this may be the deinit).
        let closing = Array(connections.values)
        connections.removeAll()
        withinLimit = 0
        overLimit = 0
        waitingConnections = 0
        for connection in closing {
            connection.detachFromServer()
            connection.close()
        }
    }

    deinit {
        close()
    }

    // MARK: - The connection limit

    private var hasLimit: Bool { settings.maxConnections > 0 }

    /// While a connection waits for a slot, responses close their connection afterwards.
    var wantsSlotsBack: Bool { waitingConnections > 0 }

    private func admit(_ connection: HTTPServerConnection) {
        guard hasLimit else {
            withinLimit += 1
            return
        }
        // Those already waiting come first; an idle slot goes to them in `sweep`.
        if withinLimit >= settings.maxConnections && settings.evictsQuietAtOnce {
            closeIdleConnection(grace: 0, acceptedBefore: batchStart)
        } else if withinLimit >= settings.maxConnections && waitingConnections == 0 {
            closeIdleConnection(grace: settings.idleGrace)
        }
        if withinLimit < settings.maxConnections {
            withinLimit += 1
        } else {
            connection.isOverLimit = true
            overLimit += 1
            waitingConnections += 1
            onLimitEvent?(.acceptedOverLimit)
            scheduleSweep()
        }
    }

    /// The socket of `connection` is closed.
    func closed(_ connection: HTTPServerConnection) {
        guard connections.removeValue(forKey: ObjectIdentifier(connection)) != nil else { return }
        if connection.isOverLimit {
            overLimit -= 1
            if !connection.isRefusedOverLimit { waitingConnections -= 1 }
        } else {
            withinLimit -= 1
            if !makingRoom { promoteLongestWaiting() }
        }
        updateAccepting()
    }

    /// An over-limit connection has a request head: whether it may be served (it took a slot) or must be
    /// refused. A request in hand proves a real client, so a connection quiet for half the grace makes
    /// way for it (the sweep that let this one in may have run a moment before others reached the grace).
    func admitRequest(on connection: HTTPServerConnection) -> Bool {
        guard connection.isOverLimit else { return true }
        closeIdleConnection(grace: settings.evictsQuietAtOnce ? 0 : settings.idleGrace / 2)
        if withinLimit < settings.maxConnections || !hasLimit {
            promote(connection)
            return true
        }
        connection.isRefusedOverLimit = true
        waitingConnections -= 1
        onLimitEvent?(.refused)
        return false
    }

    private func limitsChanged() {
        // A lower limit is reached as connections close (none is cut for it); a higher one lets waiting
        // connections in at once.
        if !hasLimit {
            for connection in connections.values where connection.isOverLimit && !connection.isRefusedOverLimit { promote(connection) }
        }
        while waitingConnections > 0, withinLimit < settings.maxConnections, promoteLongestWaiting() {}
        updateAccepting()
        scheduleSweep()
    }

    /// Closes the within-limit connection idle the longest, if any, else the one whose request head has
    /// been trickling in the longest (past the grace); its slot goes to the caller's connection.
    private func closeIdleConnection(grace: Double, acceptedBefore batch: UInt64 = .max) {
        let now = monotonicSeconds()
        let atOnce = settings.evictsQuietAtOnce
        if let idle = longestQuiet(now: now, grace: grace, where: { !$0.isOverLimit && $0.sequence < batch && $0.isIdle && !(atOnce && $0.hasUnreadBytes) }) {
            onLimitEvent?(.closedIdle)
            makingRoom = true
            idle.close()   // reports the close synchronously: `closed` frees its slot
            makingRoom = false
        } else if let stalled = longestStalledHead(now: now, grace: grace, overLimit: false), stalled.sequence < batch, !(atOnce && stalled.hasUnreadBytes) {
            onLimitEvent?(.closedStalledHead)
            makingRoom = true
            stalled.closeStalledHead()   // closes at once, like `close`
            makingRoom = false
        }
    }

    private func longestStalledHead(now: Double, grace: Double, overLimit: Bool) -> HTTPServerConnection? {
        var found: HTTPServerConnection?
        for candidate in connections.values where candidate.isOverLimit == overLimit && candidate.headStalled(now: now, grace: grace) {
            if found.map({ candidate.headStartTime < $0.headStartTime }) ?? true { found = candidate }
        }
        return found
    }

    /// Whether a within-limit connection could make room now (idle, or its head stalled).
    private func canMakeRoom(now: Double, grace: Double) -> Bool {
        longestQuiet(now: now, grace: grace, where: { !$0.isOverLimit && $0.isIdle }) != nil
            || longestStalledHead(now: now, grace: grace, overLimit: false) != nil
    }

    private func longestQuiet(now: Double, grace: Double, where condition: (HTTPServerConnection) -> Bool) -> HTTPServerConnection? {
        var found: HTTPServerConnection?
        for candidate in connections.values where now - candidate.quietSince >= grace && condition(candidate) {
            if found.map({ candidate.quietSince < $0.quietSince }) ?? true { found = candidate }
        }
        return found
    }

    @discardableResult
    private func promoteLongestWaiting() -> Bool {
        guard waitingConnections > 0, withinLimit < settings.maxConnections || !hasLimit else { return false }
        var oldest: HTTPServerConnection?
        for candidate in connections.values where candidate.isOverLimit && !candidate.isRefusedOverLimit {
            if oldest.map({ candidate.sequence < $0.sequence }) ?? true { oldest = candidate }
        }
        guard let oldest else { return false }
        promote(oldest)
        return true
    }

    private func promote(_ connection: HTTPServerConnection) {
        connection.isOverLimit = false
        overLimit -= 1
        waitingConnections -= 1
        withinLimit += 1
    }

    /// Runs while connections wait or accepting is paused: frees the slots that time has made idle.
    private func sweep() {
        let now = monotonicSeconds()
        let grace = settings.idleGrace
        while waitingConnections > 0, withinLimit >= settings.maxConnections, canMakeRoom(now: now, grace: grace) {
            closeIdleConnection(grace: grace)
            promoteLongestWaiting()
        }
        // At the hard bound, waiting connections that have said nothing, or whose head has been trickling in
        // past the grace, make way for the backlog.
        while !isAccepting, openConnections >= settings.maxConnections + settings.effectiveOverLimitAllowance {
            if let silent = longestQuiet(now: now, grace: grace, where: { $0.isOverLimit && $0.isIdle }) {
                onLimitEvent?(.closedIdle)
                silent.close()
            } else if let stalled = longestStalledHead(now: now, grace: grace, overLimit: true) {
                onLimitEvent?(.closedStalledHead)
                stalled.closeStalledHead()
            } else {
                break
            }
        }
        scheduleSweep()
    }

    private func scheduleSweep() {
        // Not re-armed while pending: a stream of arrivals would otherwise keep pushing it back.
        guard waitingConnections > 0 || !isAccepting, let sweepTimer, !sweepTimer.isScheduled else { return }
        sweepTimer.schedule(after: settings.idleGrace / 2)
    }

    private var hardBound: Int { settings.maxConnections + settings.effectiveOverLimitAllowance }

    /// At the hard bound with `evictsQuietAtOnce`: closes the connection quiet the longest (silent, or
    /// trickling a head), waiting or in a slot, accepted before `batch`. A slot it held goes to the
    /// longest waiting connection. False if none is quiet.
    private func closeQuietest(acceptedBefore batch: UInt64) -> Bool {
        let now = monotonicSeconds()
        let idle = longestQuiet(now: now, grace: 0, where: { $0.sequence < batch && !$0.isRefusedOverLimit && $0.isIdle && !$0.hasUnreadBytes })
        var stalled: HTTPServerConnection?
        for overLimit in [true, false] {
            if let candidate = longestStalledHead(now: now, grace: 0, overLimit: overLimit), candidate.sequence < batch, !candidate.hasUnreadBytes,
               stalled.map({ candidate.headStartTime < $0.headStartTime }) ?? true {
                stalled = candidate
            }
        }
        if let idle, stalled.map({ idle.quietSince <= $0.headStartTime }) ?? true {
            onLimitEvent?(.closedIdle)
            idle.close()
        } else if let stalled {
            onLimitEvent?(.closedStalledHead)
            stalled.closeStalledHead()
        } else {
            return false
        }
        return true
    }

    /// Whether any connection is quiet now (see `closeQuietest`).
    private var hasQuietConnection: Bool {
        connections.values.contains { !$0.isRefusedOverLimit && ($0.isIdle || $0.headStalled(now: .infinity, grace: 0)) }
    }

    private func updateAccepting() {
        var shouldAccept = !hasLimit || openConnections < hardBound
        // With `evictsQuietAtOnce` a quiet connection makes room for the next arrival instead.
        if !shouldAccept && settings.evictsQuietAtOnce { shouldAccept = hasQuietConnection }
        guard shouldAccept != isAccepting, let acceptEvent else { return }
        isAccepting = shouldAccept
        if shouldAccept {
            event_add(acceptEvent, nil)
        } else {
            event_del(acceptEvent)
            onLimitEvent?(.pausedAccepting)
            scheduleSweep()
        }
    }
}

let serverAcceptTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let server = Unmanaged<HTTPServer>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(server) { server.acceptReady() }
}
