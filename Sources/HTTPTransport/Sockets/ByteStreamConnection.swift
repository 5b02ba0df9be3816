import Glibc

/// An outgoing connection that carries plain bytes (a protocol other than HTTP, such as Redis' RESP) over
/// TCP, a unix socket, or TLS over TCP, on the loop.
///
/// Connecting never blocks the loop: a host name resolves on the loop's resolver and each of its addresses
/// is tried in turn with a non-blocking connect, then the TLS handshake if any; `connectTimeout` bounds
/// all of it. Bytes written before the connection is open wait and go out, in order, once it is.
///
/// `onClosed` runs exactly once when the connection ends by itself (a failed resolve, connect or
/// handshake, the peer closing, a read or write error), never after `close()`, and never inside a call
/// made by the owner (`init`, `write`): it is delivered from the loop, so an owner that fails its
/// waiting work in `onClosed` never sees that happen halfway through its own `write`. No backpressure:
/// written bytes are queued without limit, and input is handed over as it arrives.
///
/// Loop thread only.
public final class ByteStreamConnection {
    public enum Destination: Sendable, Equatable, CustomStringConvertible {
        /// A host name (resolved without blocking) or an IP literal (IPv6 with or without brackets).
        case tcp(host: String, port: UInt16)
        case unix(path: String)

        public var description: String {
            switch self {
            case .tcp(let host, let port): return host.contains(":") && !host.hasPrefix("[") ? "[\(host)]:\(port)" : "\(host):\(port)"
            case .unix(let path): return path
            }
        }
    }

    /// Why the connection ended, in words that name the destination and the cause (never bytes of the
    /// stream).
    public struct Failure: Error, CustomStringConvertible, Sendable {
        public enum Stage: Sendable, Equatable {
            /// The name did not resolve.
            case resolve
            /// No address accepted the connection (or the connect timed out).
            case connect
            /// The TLS handshake failed (verification, an alert from the peer) or timed out.
            case handshake
            /// The open connection ended: the peer closed it, or a read or write failed.
            case transfer
        }

        public let stage: Stage
        public let description: String
    }

    public let destination: Destination
    /// Runs once the connection is open (after the handshake with TLS).
    public var onConnected: (() -> Void)?
    /// Received bytes, valid only during the call.
    public var onBytes: ((UnsafeRawBufferPointer) -> Void)?
    public var onClosed: ((Failure) -> Void)?

    private let loop: TransportLoop
    private let stream: SocketStream
    private var lookup: NameLookup?
    /// Addresses not tried yet, in the resolver's order.
    private var candidates: [SocketAddress] = []
    private var lastConnectFailure: String?
    /// The address connected to, or being tried.
    private var remote: String
    private var connectTimer: TransportTimer?
    private let connectTimeout: Double?
    private var failure: Failure?
    private var reportTimer: TransportTimer?
    private var isFinished = false
    public private(set) var isOpen = false

    /// Starts connecting. Throws only for arguments that can never work (not a host name, a unix path
    /// that does not fit, TLS over a unix socket, a name OpenSSL refuses); everything else is reported
    /// through `onClosed`.
    ///
    /// - Parameters:
    ///   - tls: talk TLS with this context (SNI and the verified name: its `serverName`, else `host`).
    ///   - connectTimeout: longest resolving, connecting and the handshake may take together; nil: no limit.
    public init(loop: TransportLoop, to destination: Destination, tls: TransportTLSClientContext? = nil,
                connectTimeout: Double? = nil, inputCapacity: Int = 16 * 1024) throws(Failure) {
        self.loop = loop
        self.destination = destination
        self.connectTimeout = connectTimeout
        remote = destination.description
        var session: TLSSession?
        var address: SocketAddress?
        switch destination {
        case .unix(let path):
            guard tls == nil else { throw Failure(stage: .connect, description: "\(path): TLS over a unix socket is not supported") }
            guard let unix = SocketAddress(unixPath: path) else {
                throw Failure(stage: .connect, description: "\(path): not a usable unix socket path (empty, or longer than 107 bytes)")
            }
            address = unix
        case .tcp(let host, let port):
            if let tls {
                guard let made = tls.makeSession(host: host) else {
                    throw Failure(stage: .handshake, description: "\(host): cannot be used as a TLS server name")
                }
                session = made
            }
            address = SocketAddress(host: host, port: port)
            if address == nil && !NameLookup.isHostName(host) {
                throw Failure(stage: .resolve, description: "\(host): not a host name or IP address")
            }
        }
        stream = SocketStream(loop: loop, inputCapacity: max(inputCapacity, 1024), tls: session)
        stream.owner = self
        if let connectTimeout {
            connectTimer = TransportTimer(loop: loop) { [weak self] in self?.connectTimeExpired() }
            connectTimer?.schedule(after: connectTimeout)
        }
        if let address {
            candidates = [address]
            tryNextAddress()
        } else if case .tcp(let host, let port) = destination {
            let lookup = NameLookup.start(loop: loop, host: host, port: port) { [weak self] outcome in self?.resolved(outcome) }
            // Hosts-file names and immediate failures are answered inside `start`: nothing to cancel then.
            if !resolvedAtOnce { self.lookup = lookup }
        }
    }

    deinit {
        lookup?.cancel()
        stream.owner = nil
        stream.close()
    }

    /// Queues the bytes (sent at once when the connection is open and the socket takes them).
    public func write(_ bytes: UnsafeRawBufferPointer) {
        guard !isFinished else { return }
        stream.write(bytes)
    }

    public func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { write($0) }
    }

    /// Ends the connection now; nothing is reported afterwards.
    public func close() {
        guard !isFinished else { return }
        isFinished = true
        onClosed = nil
        onBytes = nil
        onConnected = nil
        teardown()
    }

    // MARK: - Connecting

    private var resolvedAtOnce = false

    private func resolved(_ outcome: NameLookup.Outcome) {
        lookup = nil
        resolvedAtOnce = true
        guard !isFinished else { return }
        switch outcome {
        case .failed(let reason):
            finish(Failure(stage: .resolve, description: "cannot resolve \(destination): \(reason)"))
        case .addresses(let addresses):
            candidates = addresses
            tryNextAddress()
        }
    }

    /// Connects to the next address; when none is left, the connection fails with the last cause.
    private func tryNextAddress() {
        while !candidates.isEmpty && !isFinished {
            let address = candidates.removeFirst()
            var storage = address.storage
            if address.family != AF_UNIX, let peer = PeerAddress(&storage) { remote = peer.description }
            if let error = stream.connect(to: address) {
                lastConnectFailure = "connect \(remote): \(String(cString: strerror(error)))"
                continue
            }
            return
        }
        finish(Failure(stage: .connect, description: lastConnectFailure ?? "connect \(destination): no address to try"))
    }

    private func connectTimeExpired() {
        guard !isOpen, !isFinished, let connectTimeout else { return }
        let limit = connectTimeout == connectTimeout.rounded() && connectTimeout < 1e9 ? "\(Int(connectTimeout)) s" : "\(connectTimeout) s"
        if lookup != nil {
            finish(Failure(stage: .resolve, description: "cannot resolve \(destination): no answer within \(limit)"))
        } else if stream.isHandshaking {
            finish(Failure(stage: .handshake, description: "TLS handshake with \(remote) did not finish within \(limit)"))
        } else {
            finish(Failure(stage: .connect, description: "connect \(remote) did not finish within \(limit)"))
        }
    }

    // MARK: - Ending

    /// Closes the socket and reports `failure` from the loop (see the type's comment for why never at once).
    private func finish(_ failure: Failure) {
        guard !isFinished else { return }
        isFinished = true
        self.failure = failure
        teardown()
        let timer = TransportTimer(loop: loop) { [weak self] in self?.report() }
        timer.schedule(after: 0)
        reportTimer = timer
    }

    private func report() {
        guard let failure, let tell = onClosed else { return }
        onClosed = nil
        onBytes = nil
        onConnected = nil
        tell(failure)
    }

    private func teardown() {
        connectTimer?.cancel()
        connectTimer = nil
        lookup?.cancel()
        lookup = nil
        candidates = []
        isOpen = false
        stream.close()
    }
}

extension ByteStreamConnection: SocketStreamOwner {
    func streamReceived(_ stream: SocketStream) {
        let input = stream.input
        let bytes = input.unconsumed
        let count = bytes.count
        onBytes?(UnsafeRawBufferPointer(bytes))
        input.consume(count)
    }

    func streamReachedEnd(_ stream: SocketStream) {
        finish(Failure(stage: .transfer, description: "\(remote) closed the connection"))
    }

    func streamFailed(_ stream: SocketStream, errno: Int32) {
        finish(Failure(stage: .transfer, description: "connection to \(remote) failed: \(String(cString: strerror(errno)))"))
    }

    func streamDrained(_ stream: SocketStream) {}

    func streamClosed(_ stream: SocketStream) {
        // Closed by `finish`/`close` (reported there), or by the stream itself after `streamFailed`.
        finish(Failure(stage: .transfer, description: "connection to \(remote) closed"))
    }

    func streamConnected(_ stream: SocketStream) {
        guard !isFinished else { return }
        isOpen = true
        connectTimer?.cancel()
        connectTimer = nil
        onConnected?()
    }

    func streamConnectFailed(_ stream: SocketStream, errno: Int32, reason: String, duringHandshake: Bool) {
        if duringHandshake {
            finish(Failure(stage: .handshake, description: "TLS handshake with \(remote) failed: \(reason)"))
        } else {
            lastConnectFailure = "connect \(remote): \(reason)"
            tryNextAddress()
        }
    }
}
