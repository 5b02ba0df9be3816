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
    private(set) var fd: Int32
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
    private var readEvent: OpaquePointer?
    private var writeEvent: OpaquePointer?
    private var readingPaused = false
    private var writeArmed = false
    /// Some byte has gone through the socket: a connecting socket's connect has completed.
    private(set) var hasMovedBytes = false
    /// Bytes accepted by `write` that the socket has not taken yet, from `outputStart`.
    private var output: [UInt8] = []
    private var outputStart = 0
    private(set) var isClosed = false
    /// Close once `output` is empty (after an answer that ends the connection).
    private var closeWhenFlushed = false
    /// After the last answer: input is read and dropped until the peer closes, a cap, or a timer.
    private var discarding = false
    private var discarded = 0
    private var lingerTimer: OpaquePointer?
    private let loopBase: OpaquePointer
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

    private enum Phase {
        /// No socket yet (resolving), or the last connect attempt failed.
        case unconnected
        /// Waiting for the non-blocking connect: writability, then SO_ERROR.
        case connecting
        case handshaking
        case open
    }
    private var phase: Phase
    private var tls: TLSSession?
    /// What OpenSSL said when a read or write on an open TLS stream failed (an alert from the peer, say):
    /// `streamFailed` carries only an errno, and this is the cause in words.
    private(set) var failureReason: String?
    /// The protocol the TLS server selected in ALPN (nil: plain TCP, or none selected).
    var selectedProtocol: String? { tls?.selectedProtocol }
    /// The last handshake failed because our verification refused the peer's certificate.
    var rejectedPeerCertificate: Bool { tls?.rejectedPeerCertificate ?? false }
    /// OpenSSL needs the socket writable to continue a read, or readable to continue a write.
    private var tlsReadWaitsForWrite = false
    private var tlsWriteWaitsForRead = false

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

    private func createEvents() {
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

    /// Starts a non-blocking connect. Returns nil, or the errno of an immediate failure (the stream then
    /// stays unconnected). Completion or failure is reported to the owner.
    func connect(to address: SocketAddress) -> Int32? {
        guard !isClosed, phase == .unconnected else { return EALREADY }
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return errno }
        var one: Int32 = 1
        if address.family != AF_UNIX { setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size)) }
        if address.withSockaddr({ Glibc.connect(fd, $0, $1) }) != 0 && errno != EINPROGRESS {
            let error = errno
            Glibc.close(fd)
            return error
        }
        if let tls, !tls.attach(fd: fd) {
            Glibc.close(fd)
            return ENOMEM
        }
        self.fd = fd
        createEvents()
        phase = .connecting
        // Writability reports the end of the connect, successful or not.
        armWrite()
        return nil
    }

    /// The connect finished: read from now on, handshake if TLS, then write what waited.
    private func finishConnect() {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 { error = errno }
        if error != 0 {
            connectFailed(errno: error, reason: String(cString: strerror(error)), duringHandshake: false)
            return
        }
        if let tls {
            // The handshake reads whatever the consumer wants; a pause applies once the stream is open.
            event_add(readEvent, nil)
            phase = .handshaking
            continueHandshake(tls)
            return
        }
        if !readingPaused { event_add(readEvent, nil) }
        becomeOpen()
    }

    private func continueHandshake(_ tls: TLSSession) {
        switch tls.handshake() {
        case .done:
            if readingPaused { event_del(readEvent) }
            becomeOpen()
        case .wantRead:
            disarmWrite()
        case .wantWrite:
            armWrite()
        case .end:
            connectFailed(errno: ECONNRESET, reason: "the peer closed the connection during the handshake", duringHandshake: true)
        case .failed(let error, let reason):
            connectFailed(errno: error, reason: reason, duringHandshake: true)
        }
    }

    private func becomeOpen() {
        phase = .open
        owner?.streamConnected(self)
        guard !isClosed else { return }
        if pendingOutput > 0 {
            armWrite()
            writable()
        } else {
            disarmWrite()
        }
        // The server's first bytes may have come with the end of the handshake.
        if !isClosed, !readingPaused, tls?.hasBufferedInput == true { event_active(readEvent, Int32(EV_READ), 0) }
    }

    private func connectFailed(errno error: Int32, reason: String, duringHandshake: Bool) {
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        readEvent = nil
        writeEvent = nil
        writeArmed = false
        Glibc.close(fd)
        fd = -1
        phase = .unconnected
        owner?.streamConnectFailed(self, errno: error, reason: reason, duringHandshake: duringHandshake)
    }

    /// Stops asking for input (the buffer is full, or the consumer applies backpressure). Rare by design:
    /// the steady state never touches the read registration.
    func pauseReading() {
        guard !readingPaused, !isClosed else { return }
        readingPaused = true
        if phase == .open, let readEvent { event_del(readEvent) }
    }

    func resumeReading() {
        guard readingPaused, !isClosed else { return }
        readingPaused = false
        guard phase == .open, let readEvent else { return }
        event_add(readEvent, nil)
        // Input OpenSSL already holds will not make the socket readable again.
        if tls?.hasBufferedInput == true { event_active(readEvent, Int32(EV_READ), 0) }
    }

    func readable() {
        guard !isClosed else { return }
        switch phase {
        case .unconnected, .connecting:
            return
        case .handshaking:
            if let tls { continueHandshake(tls) }
            return
        case .open:
            break
        }
        if let spliceSource {
            spliceSource.sourceReadable()
            return
        }
        if let tls {
            readTLS(tls)
            return
        }
        guard hasRoomToRead() else { return }
        while true {
            let n = Glibc.read(fd, input.end, input.spaceAtEnd)
            if n > 0 { hasMovedBytes = true }
            if n > 0 {
                input.didFill(n)
                owner?.streamReceived(self)
                input.releaseStorage()
                return
            }
            if n == 0 {
                input.releaseStorage()
                owner?.streamReachedEnd(self)
                return
            }
            let error = errno
            if error == EINTR { continue }
            if error == EAGAIN || error == EWOULDBLOCK {
                input.releaseStorage()
                return
            }
            fail(error)
            return
        }
    }

    /// Whether a read may go into the input buffer now. No: the owner has not consumed what it has (reading
    /// pauses; it resumes once it did), or the connection is lingering after its last answer (input is
    /// dropped instead).
    private func hasRoomToRead() -> Bool {
        if input.spaceAtEnd == 0 { input.compact() }
        guard input.spaceAtEnd > 0 else {
            pauseReading()
            return false
        }
        if discarding {
            discardInput()
            return false
        }
        return true
    }

    /// Reads what OpenSSL can decrypt into the free space, then hands it over once.
    private func readTLS(_ tls: TLSSession) {
        if tlsWriteWaitsForRead {
            tlsWriteWaitsForRead = false
            writable()
            guard !isClosed else { return }
        }
        // Woken by event_active for buffered input while paused: the resume comes back for it.
        guard !readingPaused else { return }
        guard hasRoomToRead() else { return }
        var received = 0
        var last = TLSSession.Step.wantRead
        while input.spaceAtEnd > 0 {
            let step = tls.read(into: input.end, count: input.spaceAtEnd)
            guard case .done(let n) = step else {
                last = step
                break
            }
            input.didFill(n)
            received += n
            // Nothing left inside OpenSSL: another SSL_read would only be a read(2) answered EAGAIN. The
            // read event is level-triggered, so bytes still in the socket wake this reader again.
            if !tls.hasBufferedInput { break }
        }
        if received > 0 { owner?.streamReceived(self) }
        guard !isClosed else { return }
        switch last {
        case .done, .wantRead:
            break
        case .wantWrite:
            tlsReadWaitsForWrite = true
            armWrite()
        case .end:
            input.releaseStorage()
            owner?.streamReachedEnd(self)
            return
        case .failed(let error, let reason):
            failureReason = reason
            fail(error)
            return
        }
        input.releaseStorage()
        if !readingPaused, tls.hasBufferedInput, let readEvent { event_active(readEvent, Int32(EV_READ), 0) }
    }

    /// Writes now as far as the socket takes it; keeps the rest and asks for writability only then.
    /// Before the stream is open everything waits in the queue.
    func write(_ bytes: UnsafeRawBufferPointer) {
        guard !isClosed, bytes.count > 0 else { return }
        var offset = 0
        if pendingOutput == 0 && phase == .open {
            guard let written = writeNow(bytes) else { return }
            offset = written
            if offset == bytes.count { return }
        }
        output.append(contentsOf: bytes[offset...])
        if phase == .open { armWrite() }
    }

    func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { write($0) }
    }

    /// Writes several pieces with one `writev` (a head and its body, a chunk's size line, data and CRLF),
    /// keeping what the socket does not take, in order.
    func write(parts: UnsafeRawBufferPointer...) {
        guard !isClosed else { return }
        var total = 0
        for part in parts { total += part.count }
        guard total > 0 else { return }
        if tls != nil {
            // OpenSSL makes a record of each write: a small head and body go out as one.
            if total <= 16 * 1024 {
                var joined: [UInt8] = []
                joined.reserveCapacity(total)
                for part in parts { joined.append(contentsOf: part) }
                write(joined)
            } else {
                for part in parts { write(part) }
            }
            return
        }
        var written = 0
        if pendingOutput == 0 && phase == .open {
            // At most four pieces (prefix, chunk size line, data, CRLF): the vector lives on the stack.
            var storage: (iovec, iovec, iovec, iovec) = (iovec(), iovec(), iovec(), iovec())
            var used = 0
            withUnsafeMutableBytes(of: &storage) { raw in
                let vectors = raw.bindMemory(to: iovec.self)
                for part in parts where part.count > 0 {
                    precondition(used < vectors.count, "write(parts:) takes at most four pieces")
                    vectors[used] = iovec(iov_base: UnsafeMutableRawPointer(mutating: part.baseAddress), iov_len: part.count)
                    used += 1
                }
            }
            while true {
                let n = withUnsafeBytes(of: &storage) { raw in writev(fd, raw.bindMemory(to: iovec.self).baseAddress, Int32(used)) }
                if n > 0 { hasMovedBytes = true }
                if n >= 0 {
                    written = n
                    break
                }
                let error = errno
                if error == EINTR { continue }
                if error == EAGAIN || error == EWOULDBLOCK { break }
                fail(error)
                return
            }
            if written == total { return }
        }
        // Queue the rest: skip what went out, keep the remainder of each piece.
        var skip = written
        for part in parts {
            if skip >= part.count {
                skip -= part.count
                continue
            }
            output.append(contentsOf: part[skip...])
            skip = 0
        }
        if phase == .open { armWrite() }
    }

    func writable() {
        guard !isClosed else { return }
        switch phase {
        case .unconnected:
            return
        case .connecting:
            finishConnect()
            return
        case .handshaking:
            if let tls { continueHandshake(tls) }
            return
        case .open:
            break
        }
        if let spliceSink, pendingOutput == 0 {
            spliceSink.sinkWritable()
            return
        }
        if tlsReadWaitsForWrite {
            tlsReadWaitsForWrite = false
            readable()
            guard !isClosed else { return }
            if pendingOutput == 0 {
                if !tlsReadWaitsForWrite { disarmWrite() }
                return
            }
        }
        while pendingOutput > 0 {
            let written = output.withUnsafeBytes { all in
                writeNow(UnsafeRawBufferPointer(rebasing: all[outputStart...]))
            }
            guard let written else { return }
            outputStart += written
            if tlsWriteWaitsForRead {
                // Writable is not what OpenSSL waits for: readable() comes back here.
                disarmWrite()
                return
            }
            if written == 0 {
                armWrite()
                return
            }
        }
        output.removeAll(keepingCapacity: output.capacity <= 256 * 1024)
        outputStart = 0
        if let spliceSink {
            spliceSink.sinkWritable()
            return
        }
        disarmWrite()
        if closeWhenFlushed {
            finishWithLinger()
            return
        }
        owner?.streamDrained(self)
    }

    /// `sendStallLimit` passed with output queued and none of it taken.
    func sendStalled() {
        guard !isClosed, phase == .open, pendingOutput > 0 || spliceSink?.holdsBytes == true else { return }
        fail(ETIMEDOUT)
    }

    /// Bytes written (possibly fewer than given; 0 when the socket is full), or nil after a failure.
    private func writeNow(_ bytes: UnsafeRawBufferPointer) -> Int? {
        if let tls { return writeTLS(tls, bytes) }
        var offset = 0
        while offset < bytes.count {
            let n = Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if n > 0 { hasMovedBytes = true }
            if n > 0 {
                offset += n
                continue
            }
            let error = errno
            if n < 0 && error == EINTR { continue }
            if n < 0 && (error == EAGAIN || error == EWOULDBLOCK) { break }
            fail(n < 0 ? error : EPIPE)
            return nil
        }
        return offset
    }

    /// OpenSSL requires a write that could not finish to be repeated with the same bytes (at least as
    /// many, from any address: ACCEPT_MOVING_WRITE_BUFFER). The unwritten rest always becomes the front
    /// of `output`, so the retry in `writable` starts with exactly those bytes.
    private func writeTLS(_ tls: TLSSession, _ bytes: UnsafeRawBufferPointer) -> Int? {
        var offset = 0
        while offset < bytes.count {
            switch tls.write(UnsafeRawBufferPointer(rebasing: bytes[offset...])) {
            case .done(let n):
                offset += n
            case .wantWrite:
                return offset
            case .wantRead:
                tlsWriteWaitsForRead = true
                return offset
            case .end:
                fail(EPIPE)
                return nil
            case .failed(let error, let reason):
                failureReason = reason
                fail(error)
                return nil
            }
        }
        return offset
    }

    func armWrite() {
        guard !writeArmed, !isClosed, !tlsWriteWaitsForRead, readEvent != nil else { return }
        if writeEvent == nil {
            let context = Unmanaged.passUnretained(self).toOpaque()
            writeEvent = event_new(loopBase, fd, Int16(EV_WRITE | EV_PERSIST), socketWriteTrampoline, context)
        }
        guard let writeEvent else { return }
        writeArmed = true
        if sendStallLimit > 0 && phase == .open {
            var tv = clampedTimeval(sendStallLimit)
            event_add(writeEvent, &tv)
        } else {
            event_add(writeEvent, nil)
        }
    }

    func disarmWrite() {
        guard writeArmed, let writeEvent else { return }
        writeArmed = false
        event_del(writeEvent)
    }

    /// Closes once every written byte has gone out, lingering: closing a socket with unread input makes
    /// the kernel send a reset, which can destroy the answer before the client read it (a client still
    /// uploading a refused body would see a broken pipe instead of the 400/413). So the write side is shut
    /// first and input is drained and dropped until the client closes, 1 MiB or 2 seconds.
    func closeAfterFlush() {
        if pendingOutput == 0 { finishWithLinger() } else { closeWhenFlushed = true }
    }

    private func finishWithLinger() {
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

    private func discardInput() {
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

/// A fixed-capacity byte buffer: the socket reads into the free space at its end, the parser consumes
/// from its start. Its memory is taken from the loop's pool only while it holds bytes, so an idle
/// keep-alive connection costs no buffer (10,000 idle clients must not mean 10,000 × 64 KiB).
final class InputBuffer {
    let capacity: Int
    private let pool: BufferPool
    private var base: UnsafeMutableRawPointer?
    private(set) var start = 0
    private(set) var endOffset = 0

    init(capacity: Int, pool: BufferPool) {
        self.capacity = capacity
        self.pool = pool
    }

    /// Also with unconsumed bytes (a connection closed after bytes it will never parse): the storage
    /// goes back to the pool either way, or each such close would leak a buffer.
    deinit {
        if let base { pool.give(base, capacity) }
    }

    var count: Int { endOffset - start }
    var spaceAtEnd: Int { capacity - endOffset }

    /// Where the next read goes (takes storage from the pool if the buffer has none).
    var end: UnsafeMutableRawPointer {
        if base == nil { base = pool.take(capacity) }
        return base! + endOffset
    }

    /// The unconsumed bytes, writable (the head parser rewrites obsolete line folding in place).
    var unconsumed: UnsafeMutableRawBufferPointer {
        guard let base else { return UnsafeMutableRawBufferPointer(start: nil, count: 0) }
        return UnsafeMutableRawBufferPointer(start: base + start, count: count)
    }

    func didFill(_ n: Int) { endOffset += n }

    func consume(_ n: Int) {
        start += min(n, count)
        if start == endOffset {
            start = 0
            endOffset = 0
        }
    }

    /// Gives the memory back while empty.
    func releaseStorage() {
        guard count == 0, let base else { return }
        pool.give(base, capacity)
        self.base = nil
    }

    /// Moves the unconsumed bytes to the front to make room at the end.
    func compact() {
        guard start > 0, let base else { return }
        let n = count
        if n > 0 { memmove(base, base + start, n) }
        start = 0
        endOffset = n
    }
}

/// Read buffers of one loop, reused: a connection holds one only while it has unconsumed input, and a
/// bounded number of free ones are kept so that busy connections do not allocate per read. Buffers of the
/// standard size and of one other size (upstream connections read into larger ones, room for a larger
/// head) are kept; fewer of the larger.
final class BufferPool {
    let size: Int
    private var free: [UnsafeMutableRawPointer] = []
    private let maxFree: Int
    private var otherSize = 0
    private var freeOther: [UnsafeMutableRawPointer] = []
    private let maxFreeOther = 8

    /// Buffers taken since the owner last asked (`takenSinceLastAsked`): how it tells a quiet loop from a busy one.
    private var taken = 0
    /// Called when a buffer is kept free while none was: the owner schedules `releaseFree` for a quiet moment.
    var onFirstKept: (() -> Void)?

    init(size: Int = 64 * 1024, maxFree: Int = 64) {
        self.size = size
        self.maxFree = maxFree
    }

    var keepsFreeBuffers: Bool { !free.isEmpty || !freeOther.isEmpty }

    func takenSinceLastAsked() -> Int {
        defer { taken = 0 }
        return taken
    }

    /// Gives every kept buffer back to malloc (after a burst, so that a quiet relay does not keep its peak).
    func releaseFree() {
        for buffer in free { buffer.deallocate() }
        for buffer in freeOther { buffer.deallocate() }
        free.removeAll()
        freeOther.removeAll()
    }

    func take(_ capacity: Int) -> UnsafeMutableRawPointer {
        taken &+= 1
        if capacity == size, let buffer = free.popLast() { return buffer }
        if capacity == otherSize, let buffer = freeOther.popLast() { return buffer }
        return UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
    }

    func give(_ buffer: UnsafeMutableRawPointer, _ capacity: Int) {
        if !keepsFreeBuffers { onFirstKept?() }
        if capacity == size && free.count < maxFree {
            free.append(buffer)
            return
        }
        if otherSize == 0 && capacity != size { otherSize = capacity }
        if capacity == otherSize && freeOther.count < maxFreeOther {
            freeOther.append(buffer)
        } else {
            buffer.deallocate()
        }
    }

    deinit {
        for buffer in free { buffer.deallocate() }
        for buffer in freeOther { buffer.deallocate() }
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
