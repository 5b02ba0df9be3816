import Glibc

/// One side of a connection that has left HTTP (after `101 Switching Protocols`): its socket, any bytes
/// already read behind the last HTTP message, and what its former owner must hear when the socket closes
/// (the server's connection slot, the upstream pool's count). Made by `detachForTunnel` /
/// `switchProtocols`; only a `ByteTunnel` can use it.
public final class TunnelEndpoint {
    let stream: SocketStream
    private var onClosed: (() -> Void)?
    /// Whether the endpoint went into a tunnel (an unused one closes its socket when freed).
    fileprivate var isUsed = false

    init(stream: SocketStream, onClosed: @escaping () -> Void) {
        self.stream = stream
        self.onClosed = onClosed
    }

    /// Once, when the socket has closed.
    fileprivate func closed() {
        let tell = onClosed
        onClosed = nil
        tell?()
    }

    /// Taken by a new owner of the socket other than a tunnel (an HTTP/2 connection), which calls
    /// `closedByOwner()` once the socket has closed.
    func markUsed() { isUsed = true }

    func closedByOwner() { closed() }

    /// Bytes read from the peer that no one has consumed yet (the first frame may come with the 101).
    public var bufferedBytes: Int { stream.input.count }

    /// Closes the socket without a tunnel (the other side could not be had).
    public func close() {
        guard !isUsed else { return }
        stream.close()
        closed()
    }

    deinit {
        if !isUsed {
            stream.close()
            closed()
        }
    }
}

/// Relays bytes both ways between two connections, byte for byte, until both directions have ended.
///
/// - Backpressure: what one side sends is written to the other at once; while the other's unsent output
///   is above `Settings.bufferLimit`, the sending side is not read (TCP then holds its peer back), and
///   reading resumes when that output has drained. Memory per tunnel stays within the limit plus one read.
/// - Bytes that arrived before the tunnel (behind the request head, or in the same read as the 101) go
///   first.
/// - Half-close: the end of one side's input (a FIN, or TLS close_notify) is passed on as a shutdown of
///   the other side's sending direction once everything before it has been written; the opposite direction
///   carries on. When both directions have ended the tunnel closes both sockets.
/// - A failed read or write on either side, `close()`, or `idleTimeout` seconds without a byte either way
///   closes both at once.
/// - `onEnd` is called exactly once, after both sockets are closed. The tunnel keeps itself alive until then.
///
/// Loop thread only.
public final class ByteTunnel {
    public struct Settings: Sendable {
        /// Unsent output on one side above which the other side is not read.
        public var bufferLimit: Int
        /// Seconds without a byte in either direction after which the tunnel is closed; 0 = never.
        public var idleTimeout: Double

        public init(bufferLimit: Int = 256 * 1024, idleTimeout: Double = 0) {
            self.bufferLimit = bufferLimit
            self.idleTimeout = idleTimeout
        }
    }

    public enum End: Sendable, Equatable {
        /// Both sides ended their input (each FIN passed on), or one side closed after the other.
        case closed
        /// No byte either way within `idleTimeout`.
        case idleTimeout
        /// A read or write failed on one side (reset, broken pipe); both were closed.
        case failed(errno: Int32)
        /// `close()` was called.
        case cut
    }

    /// Bytes relayed from the first endpoint to the second, and the other way.
    public private(set) var bytesFromFirst = 0
    public private(set) var bytesFromSecond = 0
    public private(set) var hasEnded = false

    private final class Side {
        let endpoint: TunnelEndpoint
        var stream: SocketStream { endpoint.stream }
        /// Its peer sent no more (FIN).
        var inputEnded = false
        /// Our sending direction to it is shut (its peer's counterpart's FIN passed on).
        var outputShut = false
        /// Shut as soon as the queued output is written.
        var shutWhenDrained = false
        /// Not read because the other side's output is over the limit.
        var heldBack = false
        var closed = false
        init(_ endpoint: TunnelEndpoint) { self.endpoint = endpoint }
    }

    private let first: Side
    private let second: Side
    private let settings: Settings
    private var onEnd: ((End) -> Void)?
    private var idleTimer: TransportTimer?
    private var lastActivity = monotonicSeconds()
    private var failure: Int32?
    private var selfRetain: ByteTunnel?
    private var ending = false

    /// Both sockets are closed before the tunnel lets itself go (`onEnd`); should one not be, it stops
    /// reporting here (`SocketStream.owner` is unowned).
    deinit {
        first.stream.ownerLeaving(ObjectIdentifier(self))
        second.stream.ownerLeaving(ObjectIdentifier(self))
    }

    /// Starts relaying at once (bytes already buffered on either side are passed on now). Each endpoint
    /// can be used once.
    public init(loop: TransportLoop, _ first: TunnelEndpoint, _ second: TunnelEndpoint, settings: Settings = Settings(),
                onEnd: @escaping (End) -> Void) {
        precondition(!first.isUsed && !second.isUsed && first !== second, "a tunnel endpoint is used once")
        first.isUsed = true
        second.isUsed = true
        self.first = Side(first)
        self.second = Side(second)
        self.settings = settings
        self.onEnd = onEnd
        selfRetain = self
        if settings.idleTimeout > 0 {
            idleTimer = TransportTimer(loop: loop) { [weak self] in self?.idleCheck() }
            idleTimer?.schedule(after: settings.idleTimeout)
        }
        for side in [self.first, self.second] { side.stream.owner = self }
        if self.first.stream.isClosed || self.second.stream.isClosed {
            finish(.closed)
            return
        }
        for side in [self.first, self.second] where !hasEnded {
            relay(from: side)
            if !side.heldBack { side.stream.resumeReading() }
        }
    }

    /// Closes both sides now (shutdown's drain deadline).
    public func close() {
        finish(.cut)
    }

    private func side(_ stream: SocketStream) -> Side? {
        if stream === first.stream { return first }
        if stream === second.stream { return second }
        return nil
    }

    private func other(_ side: Side) -> Side { side === first ? second : first }

    /// Writes what `side` has read to the other side, and holds `side` back if that output is now over the limit.
    private func relay(from side: Side) {
        let input = side.stream.input
        guard !hasEnded, input.count > 0 else { return }
        let target = other(side)
        let count = input.count
        lastActivity = monotonicSeconds()
        if side === first { bytesFromFirst += count } else { bytesFromSecond += count }
        target.stream.write(UnsafeRawBufferPointer(input.unconsumed))
        input.consume(count)
        input.releaseStorage()
        guard !hasEnded, !target.stream.isClosed else { return }
        if target.stream.pendingOutput > settings.bufferLimit && !side.heldBack {
            side.heldBack = true
            side.stream.pauseReading()
        }
    }

    private func shutOutput(of side: Side) {
        guard !side.outputShut else { return }
        if side.stream.pendingOutput > 0 {
            side.shutWhenDrained = true
            return
        }
        side.shutWhenDrained = false
        side.outputShut = true
        side.stream.shutdownWrite()
        finishIfBothDirectionsEnded()
    }

    private func finishIfBothDirectionsEnded() {
        if first.inputEnded && second.inputEnded && first.outputShut && second.outputShut { finish(.closed) }
    }

    private func idleCheck() {
        guard !hasEnded else { return }
        let quiet = monotonicSeconds() - lastActivity
        if quiet >= settings.idleTimeout {
            finish(.idleTimeout)
        } else {
            idleTimer?.schedule(after: settings.idleTimeout - quiet)
        }
    }

    /// Closes both sockets (each tells its former owner), then reports the end once.
    private func finish(_ end: End) {
        guard !ending else { return }
        ending = true
        hasEnded = true
        idleTimer?.cancel()
        for side in [first, second] where !side.closed {
            side.closed = true
            side.stream.close()
            side.endpoint.closed()
        }
        let report = onEnd
        onEnd = nil
        report?(end)
        selfRetain = nil
    }
}

extension ByteTunnel: SocketStreamOwner {
    func streamReceived(_ stream: SocketStream) {
        guard let side = side(stream) else { return }
        relay(from: side)
    }

    func streamReachedEnd(_ stream: SocketStream) {
        guard let side = side(stream), !side.inputEnded else { return }
        side.inputEnded = true
        lastActivity = monotonicSeconds()
        // The end is reported on every readiness from now on: stop asking.
        stream.pauseReading()
        shutOutput(of: other(side))
        finishIfBothDirectionsEnded()
    }

    func streamFailed(_ stream: SocketStream, errno: Int32) {
        if failure == nil { failure = errno }
    }

    func streamDrained(_ stream: SocketStream) {
        guard let side = side(stream), !hasEnded else { return }
        // A slow reader draining what is held back is activity too: the idle limit is for silence.
        lastActivity = monotonicSeconds()
        let source = other(side)
        if source.heldBack {
            source.heldBack = false
            source.stream.resumeReading()
        }
        if side.shutWhenDrained { shutOutput(of: side) }
    }

    func streamClosed(_ stream: SocketStream) {
        guard let side = side(stream), !side.closed else { return }
        side.closed = true
        side.endpoint.closed()
        // A side closed under us (a failure, or its former owner's server shutting down): the other goes too.
        finish(failure.map { .failed(errno: $0) } ?? .closed)
    }
}
