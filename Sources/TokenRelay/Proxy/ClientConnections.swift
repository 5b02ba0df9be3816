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
/// connection before it is adopted.
///
/// At the limit:
/// 1. The connection idle the longest is closed to make room. Idle means no request in progress and
///    nothing buffered either way, and either a request already answered (a keep-alive connection) or
///    `freshConnectionGrace` passed without one: a client that has just connected is about to send.
///    nginx does the same with idle keep-alive connections, and clients must expect it: a server may
///    close an idle connection at any time (RFC 9112 §9.5).
/// 2. If every connection is busy, the newcomer is *over the limit*. It is promoted as soon as another
///    connection closes. If its request arrives first, and still no connection is idle, the request is
///    answered 503 with `Retry-After` and the connection is closed. The client gets an answer, not a hang.
/// 3. At most `overLimitAllowance` connections are over the limit at once. Beyond that the listener
///    stops accepting, and new connections wait in the kernel's listen backlog until one closes. This is
///    the bound on file descriptors and memory.
///
/// Confined to the event loop.
final class ClientConnections {
    /// One accepted connection. Its close callback points at this object, which the registry keeps alive
    /// until that callback has run.
    final class Connection {
        fileprivate let handle: OpaquePointer
        fileprivate unowned let registry: ClientConnections
        fileprivate let sequence: UInt64
        fileprivate var isOverLimit = false
        /// The exchange answering this connection's current request. The exchange detaches before it
        /// ends, so this strong reference never outlives the exchange's own self-retain.
        fileprivate var exchange: Exchange?
        fileprivate var idleSince = EventLoop.monotonicNow
        fileprivate var hasAnsweredARequest = false

        fileprivate init(handle: OpaquePointer, registry: ClientConnections, sequence: UInt64) {
            self.handle = handle
            self.registry = registry
            self.sequence = sequence
        }

        /// evhttp is freeing the connection (client hang-up, timeout, close after a response, our own abort).
        func closed() { registry.closed(self) }
    }

    enum Admission {
        case admitted
        /// Every slot is taken by a connection with a request in progress: answer 503 and close.
        case overLimit
    }

    /// How long a connection that has not sent a request yet is safe from being closed to make room.
    static let freshConnectionGrace = 1.0

    let maxConnections: Int
    /// How many connections beyond `maxConnections` are accepted only to be answered 503.
    let overLimitAllowance: Int
    private let metrics: RelayMetrics
    private let logger: Logger
    private var connections: [OpaquePointer: Connection] = [:]
    /// Bufferevents made for just-accepted connections whose `evhttp_connection` is not adopted yet.
    private var unadopted: [OpaquePointer] = []
    private var adoptEvent: LoopEvent!
    private var withinLimit = 0
    private var overLimit = 0
    private var nextSequence: UInt64 = 0
    private var accepting = true
    /// Set while closing an idle connection for a particular newcomer, so its slot goes to that newcomer.
    private var makingRoom = false
    /// Called with false to pause accepting, and with true to resume.
    var setAccepting: ((Bool) -> Void)?

    init(loop: EventLoop, maxConnections: Int, metrics: RelayMetrics, logger: Logger) {
        self.maxConnections = maxConnections
        overLimitAllowance = Self.overLimitAllowance(for: maxConnections)
        self.metrics = metrics
        self.logger = logger
        adoptEvent = LoopEvent(loop: loop) { [unowned self] _ in self.adoptAccepted() }
    }

    /// The allowance for answering connections over the limit: an eighth of the limit, at least 16.
    static func overLimitAllowance(for maxConnections: Int) -> Int { max(16, maxConnections / 8) }

    /// Connections open now, counting the over-limit ones and those not adopted yet.
    var openCount: Int { withinLimit + overLimit + unadopted.count }

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
        let accepted = unadopted
        unadopted = []
        for bufferEvent in accepted {
            var argument: UnsafeMutableRawPointer?
            bufferevent_getcb(bufferEvent, nil, nil, nil, &argument)
            guard let argument else { continue }
            adopt(OpaquePointer(argument))
        }
        updateAccepting()
    }

    private func adopt(_ handle: OpaquePointer) {
        nextSequence += 1
        let connection = Connection(handle: handle, registry: self, sequence: nextSequence)
        connections[handle] = connection
        evhttp_connection_set_closecb(handle, clientConnectionClosedTrampoline, unretainedContext(connection))
        if withinLimit >= maxConnections { closeLongestIdle() }
        if withinLimit < maxConnections {
            withinLimit += 1
        } else {
            connection.isOverLimit = true
            overLimit += 1
            if overLimit == 1 {
                logger.warning("client connection limit reached; new connections are answered 503 until one closes",
                               metadata: ["max_client_connections": "\(maxConnections)"])
            }
        }
        metrics.clientConnections.record(Double(withinLimit + overLimit))
    }

    fileprivate func closed(_ connection: Connection) {
        guard connections.removeValue(forKey: connection.handle) != nil else { return }
        if connection.isOverLimit {
            overLimit -= 1
        } else {
            withinLimit -= 1
            if !makingRoom { promoteOldestOverLimit() }
        }
        metrics.clientConnections.record(Double(withinLimit + overLimit))
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
        if connection.isOverLimit {
            closeLongestIdle()
            if withinLimit < maxConnections {
                promote(connection)
            } else {
                metrics.countClientConnectionLimit(action: "refused")
                return .overLimit
            }
        }
        return .admitted
    }

    /// The exchange on `handle` has answered (or given up) and no longer wants its close notice.
    func detach(from handle: OpaquePointer) {
        guard let connection = connections[handle] else { return }
        connection.exchange = nil
        connection.hasAnsweredARequest = true
        connection.idleSince = EventLoop.monotonicNow
    }

    // MARK: - Making room

    /// Frees a slot for the caller's connection if one within the limit is idle.
    private func closeLongestIdle() {
        let now = EventLoop.monotonicNow
        var longestIdle: Connection?
        for candidate in connections.values where !candidate.isOverLimit && Self.isIdle(candidate, now: now) {
            if longestIdle.map({ candidate.idleSince < $0.idleSince }) ?? true { longestIdle = candidate }
        }
        guard let longestIdle else { return }
        metrics.countClientConnectionLimit(action: "closed_idle")
        logger.debug("closing an idle client connection to make room", metadata: ["max_client_connections": "\(maxConnections)"])
        makingRoom = true
        evhttp_connection_free(longestIdle.handle)  // calls `closed`, which frees its slot
        makingRoom = false
    }

    /// No request in progress, no unparsed request bytes, no response bytes still to write, and not a
    /// connection whose first request is probably on its way.
    private static func isIdle(_ connection: Connection, now: Double) -> Bool {
        guard connection.exchange == nil else { return false }
        guard connection.hasAnsweredARequest || now - connection.idleSince >= freshConnectionGrace else { return false }
        let bufferEvent = evhttp_connection_get_bufferevent(connection.handle)
        return EvBuffer.length(bufferevent_get_input(bufferEvent)) == 0 && EvBuffer.length(bufferevent_get_output(bufferEvent)) == 0
    }

    private func promoteOldestOverLimit() {
        guard overLimit > 0, withinLimit < maxConnections else { return }
        let oldest = connections.values.filter(\.isOverLimit).min { $0.sequence < $1.sequence }
        if let oldest { promote(oldest) }
    }

    private func promote(_ connection: Connection) {
        connection.isOverLimit = false
        overLimit -= 1
        withinLimit += 1
    }

    private func updateAccepting() {
        let shouldAccept = openCount < maxConnections + overLimitAllowance
        guard shouldAccept != accepting else { return }
        accepting = shouldAccept
        if !shouldAccept {
            metrics.countClientConnectionLimit(action: "paused_accepting")
            logger.warning("client connections at the hard bound; new connections wait in the listen backlog",
                           metadata: ["open": "\(openCount)", "max_client_connections": "\(maxConnections)"])
        }
        setAccepting?(shouldAccept)
    }
}
