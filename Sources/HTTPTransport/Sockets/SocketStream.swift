import CLibevent
import Glibc

/// What a `SocketStream` reports to the connection that owns it. Called on the loop's thread.
protocol SocketStreamOwner: AnyObject {
    /// New bytes are in `stream.input`.
    func streamReceived(_ stream: SocketStream)
    /// The peer closed its side (read returned 0).
    func streamReachedEnd(_ stream: SocketStream)
    /// A read or write failed (reset, broken pipe); the stream closes right after this call.
    func streamFailed(_ stream: SocketStream, errno: Int32)
    /// Output that had to wait for the socket has all been written.
    func streamDrained(_ stream: SocketStream)
    /// The descriptor is closed (after any lingering); the stream will report nothing more.
    func streamClosed(_ stream: SocketStream)
    /// An outgoing stream's connect (and TLS handshake) finished; queued output is being written.
    func streamConnected(_ stream: SocketStream)
    /// An outgoing stream's connect attempt failed: its socket is closed and the stream is unconnected
    /// again, so the owner may `connect` it to another address (not after a failed handshake, whose TLS
    /// state is spent) or `close` it.
    func streamConnectFailed(_ stream: SocketStream, errno: Int32, reason: String, duringHandshake: Bool)
}

extension SocketStreamOwner {
    // Accepted streams are connected from the start.
    func streamConnected(_ stream: SocketStream) {}
    func streamConnectFailed(_ stream: SocketStream, errno: Int32, reason: String, duringHandshake: Bool) {}
}

/// A non-blocking socket registered with the loop once: a persistent read event for its whole life, and a
/// write event added only while written bytes wait for the socket. Reads go straight into one large
/// buffer and writes are tried at once, so an exchange of small messages costs one read and one write per
/// message and no change to the epoll set.
///
/// An outgoing stream starts unconnected (its owner may still be resolving the name); output written
/// before the connect, and the TLS handshake if any, have finished waits in the output queue. With TLS,
/// reads and writes go through OpenSSL on the same socket (`TLSSession`), which may also need the
/// opposite readiness (a read that must write first, or the reverse) and may hold decrypted input the
/// socket will not announce again.
final class SocketStream {
    // State the extensions in SocketStream+Connect/+Read/+Write.swift read and set is internal, not private
    // (a `private` member is visible only in this file); nothing outside the stream touches it.
    var fd: Int32
    let input: InputBuffer
    /// The connection (or tunnel) the stream reports to. `unowned`, not `weak`: a weak reference gives
    /// its target a side table, and every later retain and release of that object (several per request
    /// for a connection) then takes the runtime's slow path through it. The owner owns the stream, so it
    /// outlives it except in one case: a stream handed to a tunnel endpoint that outlives its former
    /// owner. So an owner tells its stream when it goes (`ownerLeaving`, from its deinit), and this never
    /// refers to a freed object; were that rule broken, safe `unowned` traps instead of reading freed memory.
    unowned var owner: SocketStreamOwner? {
        didSet { ownerIdentity = owner.map { ObjectIdentifier($0) } }
    }
    /// Who `owner` is, comparable without touching the object (it may be deinitializing).
    private var ownerIdentity: ObjectIdentifier?
    var readEvent: OpaquePointer?
    var writeEvent: OpaquePointer?
    var readingPaused = false
    var writeArmed = false
    /// Some byte has gone through the socket: a connecting socket's connect has completed.
    var hasMovedBytes = false
    /// Bytes accepted by `write` that the socket has not taken yet, from `outputStart`.
    var output: [UInt8] = []
    var outputStart = 0
    private(set) var isClosed = false
    /// Close once `output` is empty (after an answer that ends the connection).
    var closeWhenFlushed = false
    /// After the last answer: input is read and dropped until the peer closes, a cap, or a timer.
    var discarding = false
    private var discarded = 0
    private var lingerTimer: OpaquePointer?
    let loopBase: OpaquePointer
    /// Seconds an open stream may wait with output queued and the socket taking none of it before it is
    /// failed with `ETIMEDOUT`; 0 = no limit. A peer that stops reading would otherwise hold its
    /// connection, and what is queued for it, for as long as it likes. It costs nothing per write: the
    /// limit is the write event's own timeout, armed only while output waits, and libevent starts a
    /// persistent event's timeout again each time the event fires, so any progress restarts it.
    var sendStallLimit: Double = 0
    /// While a body is spliced from this socket, its readability goes to the splice instead of `read`.
    weak var spliceSource: BodySplice?
    /// While a body is spliced to this socket, its writability goes to the splice once the output queue
    /// is empty (bytes queued before the splice started go first; nothing is queued while it runs).
    weak var spliceSink: BodySplice?

    enum Phase {
        /// No socket yet (resolving), or the last connect attempt failed.
        case unconnected
        /// Waiting for the non-blocking connect: writability, then SO_ERROR.
        case connecting
        case handshaking
        case open
    }
    var phase: Phase
    var tls: TLSSession?
    /// What OpenSSL said when a read or write on an open TLS stream failed (an alert from the peer, say):
    /// `streamFailed` carries only an errno, and this is the cause in words.
    var failureReason: String?
    /// The protocol the TLS server selected in ALPN (nil: plain TCP, or none selected).
    var selectedProtocol: String? { tls?.selectedProtocol }
    /// The last handshake failed because our verification refused the peer's certificate.
    var rejectedPeerCertificate: Bool { tls?.rejectedPeerCertificate ?? false }
    /// OpenSSL needs the socket writable to continue a read, or readable to continue a write.
    var tlsReadWaitsForWrite = false
    var tlsWriteWaitsForRead = false

    /// An accepted socket, open from the start.
    init(loop: TransportLoop, fd: Int32, inputCapacity: Int) {
        self.fd = fd
        self.input = InputBuffer(capacity: inputCapacity, pool: loop.bufferPool)
        self.loopBase = loop.base
        phase = .open
        createEvents()
        event_add(readEvent, nil)
    }

    /// An outgoing stream, unconnected until `connect(to:)`; with `tls`, open only after the handshake.
    init(loop: TransportLoop, inputCapacity: Int, tls: TLSSession?) {
        self.fd = -1
        self.input = InputBuffer(capacity: inputCapacity, pool: loop.bufferPool)
        self.loopBase = loop.base
        self.tls = tls
        phase = .unconnected
    }

    func createEvents() {
        let context = Unmanaged.passUnretained(self).toOpaque()
        readEvent = event_new(loopBase, fd, Int16(EV_READ | EV_PERSIST), socketReadTrampoline, context)
        // The write event is made by the first `armWrite`: most sockets never find the kernel's buffer
        // full, and an idle keep-alive client should hold no event it does not use (bench/README.md,
        // "Idle clients").
    }

    /// Called by an owner's deinit: the stream stops reporting to it (unless it reports to another by now,
    /// a tunnel that took it over).
    func ownerLeaving(_ leaving: ObjectIdentifier) {
        guard ownerIdentity == leaving else { return }
        owner = nil
    }

    var pendingOutput: Int { output.count - outputStart }
    /// For tests: the write event has been made (the first time output had to wait, or the connect).
    var holdsWriteEvent: Bool { writeEvent != nil }

    var isOpen: Bool { phase == .open && !isClosed }
    var usesTLS: Bool { tls != nil }
    var isHandshaking: Bool { phase == .handshaking }

    /// Closes once every written byte has gone out, lingering: closing a socket with unread input makes
    /// the kernel send a reset, which can destroy the answer before the client read it (a client still
    /// uploading a refused body would see a broken pipe instead of the 400/413). So the write side is shut
    /// first and input is drained and dropped until the client closes, 1 MiB or 2 seconds.
    func closeAfterFlush() {
        if pendingOutput == 0 { finishWithLinger() } else { closeWhenFlushed = true }
    }

    func finishWithLinger() {
        guard !isClosed, !discarding else { return }
        closeWhenFlushed = false
        discarding = true
        shutdown(fd, Int32(SHUT_WR))
        resumeReading()
        lingerTimer = event_new(loopBase, -1, 0, socketLingerTrampoline, Unmanaged.passUnretained(self).toOpaque())
        var tv = timeval(tv_sec: 2, tv_usec: 0)
        event_add(lingerTimer, &tv)
        discardInput()
    }

    func discardInput() {
        var scratch = (UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        while !isClosed {
            let n = withUnsafeMutableBytes(of: &scratch) { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n > 0 {
                discarded += n
                if discarded > 1 << 20 { close() }
                continue
            }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { return }
            close()   // end of input, or an error: either way done
        }
    }

    func lingerExpired() { close() }

    /// Our side sends no more (a tunnel passing on the peer's FIN): close_notify first with TLS, then a
    /// FIN; reading goes on. Only when nothing waits in `output`: the FIN would overtake those bytes.
    private(set) var isWriteShut = false

    func shutdownWrite() {
        guard !isClosed, !isWriteShut, phase == .open else { return }
        isWriteShut = true
        tls?.closeQuietly()
        shutdown(fd, Int32(SHUT_WR))
    }

    /// The status code of an HTTP/1.x status line waiting unread in the socket (looked at, not taken), or
    /// nil: none, or a TLS stream (its bytes are records). Data the peer sent before it reset can still be
    /// read after the reset.
    func peekStatusCode() -> Int? {
        guard !isClosed, tls == nil else { return nil }
        var line = [UInt8](repeating: 0, count: 12)
        let n = line.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 12, Int32(MSG_PEEK | MSG_DONTWAIT)) }
        guard n == 12, line.starts(with: Array("HTTP/1.".utf8)), line[8] == UInt8(ascii: " ") else { return nil }
        var code = 0
        for byte in line[9..<12] {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            code = code * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return code
    }

    /// Reports the failure (so the owner knows why) and then closes.
    func fail(_ error: Int32) {
        guard !isClosed else { return }
        owner?.streamFailed(self, errno: error)
        close()
    }

    func close() {
        guard !isClosed else { return }
        // A handshake given up (a connect timeout, whoever owns the stream) forgets the name's cached session,
        // as one that failed does: the session offered may be what the server stalls on.
        if phase == .handshaking, let tls { tls.context.sessionCache.forget(tls.name) }
        release()
        owner?.streamClosed(self)
    }

    private func release() {
        guard !isClosed else { return }
        isClosed = true
        // A splice using this socket stops first (its pipe is not this socket's to keep).
        spliceSource?.streamClosing(self)
        spliceSink?.streamClosing(self)
        if phase == .open && !isWriteShut { tls?.closeQuietly() }
        // Unregister before closing the descriptor: the number may be reused by the next accept.
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        if let lingerTimer { event_free(lingerTimer) }
        readEvent = nil
        writeEvent = nil
        lingerTimer = nil
        if fd >= 0 { Glibc.close(fd) }
        tls = nil
    }

    deinit {
        release()
    }
}

let socketReadTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let stream = Unmanaged<SocketStream>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(stream) { stream.readable() }
}

let socketLingerTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let stream = Unmanaged<SocketStream>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(stream) { stream.lingerExpired() }
}

let socketWriteTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, what, context in
    guard let context else { return }
    let stream = Unmanaged<SocketStream>.fromOpaque(context).takeUnretainedValue()
    if Int32(what) & Int32(EV_TIMEOUT) != 0 && Int32(what) & Int32(EV_WRITE) == 0 {
        withExtendedLifetime(stream) { stream.sendStalled() }
    } else {
        withExtendedLifetime(stream) { stream.writable() }
    }
}
