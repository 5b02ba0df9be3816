import CLibevent
import CTransportSocket
import HTTPWire
import Glibc

/// A listening socket whose accepted connections become `HTTPServerConnection`s.
///
/// The server accepts itself (no evconnlistener): the peer address comes with `accept4`, sockets are
/// non-blocking and close-on-exec from the start, and the number of open connections is exact.
public final class HTTPServer {
    public struct ListenError: Error, CustomStringConvertible {
        public let description: String
    }

    public let port: UInt16
    public var openConnections: Int { connections.count }
    private let loop: TransportLoop
    private let fd: Int32
    private var acceptEvent: OpaquePointer?
    private let limits: HTTPWireLimits
    private let inputCapacity: Int
    private let headTimeout: Double
    /// Called with each accepted connection (settable after init, for owners that create the server in theirs).
    public var onConnection: (HTTPServerConnection) -> Void
    private var connections: [ObjectIdentifier: HTTPServerConnection] = [:]

    /// Listens on an IP address literal ("127.0.0.1", "0.0.0.0", "::1", "[::]"); port 0 picks a free port
    /// (see `port`).
    /// `headTimeout`: seconds a request head may take from its first byte to its last (0: unbounded).
    public init(loop: TransportLoop, host: String, port: UInt16, backlog: Int32 = 511, limits: HTTPWireLimits = HTTPWireLimits(),
                inputCapacity: Int = 64 * 1024, headTimeout: Double = 10,
                onConnection: @escaping (HTTPServerConnection) -> Void) throws(ListenError) {
        self.loop = loop
        self.headTimeout = headTimeout
        self.limits = limits
        self.inputCapacity = inputCapacity
        self.onConnection = onConnection
        guard let address = SocketAddress(host: host, port: port) else {
            throw ListenError(description: "\(host): not an IP address literal")
        }
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ListenError(description: "socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        let bound = address.withSockaddr { bind(fd, $0, $1) }
        guard bound == 0, listen(fd, backlog) == 0 else {
            let message = String(cString: strerror(errno))
            Glibc.close(fd)
            throw ListenError(description: "\(host):\(port): \(message)")
        }
        var actual = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        self.port = PeerAddress(&actual)?.port ?? port
        self.fd = fd
        acceptEvent = event_new(loop.base, fd, Int16(EV_READ | EV_PERSIST), serverAcceptTrampoline, Unmanaged.passUnretained(self).toOpaque())
        event_add(acceptEvent, nil)
    }

    func acceptReady() {
        // Several connections may be waiting; take a bounded batch so one busy listener cannot starve the
        // connections already open.
        for _ in 0..<64 {
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
            let connection = HTTPServerConnection(loop: loop, fd: client, peer: peer, limits: limits, inputCapacity: inputCapacity,
                                                  headTimeout: headTimeout)
            let id = ObjectIdentifier(connection)
            connections[id] = connection
            connection.onEnded = { [weak self] ended in
                self?.connections[ObjectIdentifier(ended)] = nil
            }
            onConnection(connection)
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
        for connection in Array(connections.values) { connection.close() }
        connections.removeAll()
    }

    deinit {
        close()
    }
}

let serverAcceptTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let server = Unmanaged<HTTPServer>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(server) { server.acceptReady() }
}
