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
    // State the connection limit's rules in HTTPServer+ConnectionLimit.swift read and set is internal, not
    // private (a `private` member is visible only in this file); nothing outside the server sets it.
    public struct ListenError: Error, CustomStringConvertible {
        public let description: String
    }

    public let port: UInt16
    /// Open connections, those waiting over the limit included (until their socket is closed).
    public var openConnections: Int { connections.count }
    /// Over-limit connections waiting for a slot (on every listener of the server's `limitGroup`).
    public var waitingConnections: Int { limitGroup.waitingConnections }
    /// The listeners this one shares its connection limit with (itself alone unless given one).
    public let limitGroup: ConnectionLimitGroup
    public internal(set) var isAccepting = true
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
    var acceptEvent: OpaquePointer?
    /// Called with each accepted connection (settable after init, for owners that create the server in theirs).
    public var onConnection: (HTTPServerConnection) -> Void
    var connections: [ObjectIdentifier: HTTPServerConnection] = [:]
    /// The sequence of the first connection of the accept batch under way (see `evictsQuietAtOnce`).
    var batchStart: UInt64 = .max
    var sweepTimer: TransportTimer?

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

    /// `limitGroup`: listeners whose connections count against one limit with this one's (nil: a group of its own).
    public init(loop: TransportLoop, host: String, port: UInt16, backlog: Int32 = 511, settings: Settings,
                limitGroup: ConnectionLimitGroup? = nil, onConnection: @escaping (HTTPServerConnection) -> Void) throws(ListenError) {
        self.loop = loop
        self.settings = settings
        self.limitGroup = limitGroup ?? ConnectionLimitGroup()
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
        self.limitGroup.join(self)
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
        batchStart = limitGroup.nextSequence + 1
        for _ in 0..<64 {
            guard isAccepting, acceptEvent != nil else { return }
            // Nothing from this batch quiet enough to close: the level-triggered event fires again after
            // this turn's reads, when this batch's connections have had their chance to send.
            if settings.evictsQuietAtOnce, hasLimit, limitGroup.openConnections >= hardBound, !closeQuietest(acceptedBefore: batchStart) { return }
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
            limitGroup.nextSequence += 1
            let fixed = connectionSettings ?? HTTPServerConnection.FixedSettings(settings)
            connectionSettings = fixed
            let connection = HTTPServerConnection(loop: loop, fd: client, peer: peer, settings: settings, fixed: fixed,
                                                  sequence: limitGroup.nextSequence)
            let id = ObjectIdentifier(connection)
            connections[id] = connection
            connection.server = self
            admit(connection)
            onConnection(connection)
            updateAcceptingInGroup()
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
        // Only this listener's share of the group's counts goes.
        for connection in closing {
            if !connection.isOverLimit {
                limitGroup.withinLimit -= 1
            } else {
                limitGroup.overLimit -= 1
                if !connection.isRefusedOverLimit { limitGroup.waitingConnections -= 1 }
            }
        }
        for connection in closing {
            connection.detachFromServer()
            connection.close()
        }
    }

    deinit {
        close()
        limitGroup.leave(ObjectIdentifier(self))
    }

}

let serverAcceptTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let server = Unmanaged<HTTPServer>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(server) { server.acceptReady() }
}
