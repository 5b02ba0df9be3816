import CTransportSocket
import Glibc

/// Moves the rest of a response body of known length from an upstream socket to a client socket through a
/// pipe with splice(2), so that the bytes never pass through user space (see `docs/splice.md`).
///
/// It borrows both sockets' events instead of adding its own: while it runs, the upstream stream hands
/// its readability here instead of reading, and the client stream its writability instead of writing
/// its queue. Interest follows the pipe both ways: the upstream is read only while the pipe may have room,
/// and the client is waited for only while the pipe holds bytes. The client's write event keeps its
/// send-stall timeout (`SocketStream.sendStallLimit`), so a client that takes nothing for that long is
/// failed as on the copying path.
///
/// Exactly `remaining` bytes are taken from the upstream (never more: what follows a response must stay
/// in the socket for the connection's own check of unsolicited bytes), and each byte the client's socket
/// takes is counted off the client response's announced length.
final class BodySplice {
    /// Where the splice reports: the upstream connection that owns it. Neither connection is held weakly
    /// (a weak reference would give it a side table and slow every retain of it): the owner is the only
    /// one that holds the splice (the streams hold it weakly), so the splice never outlives it; the
    /// client is held until `stop()`, which every end of the splice goes through.
    private unowned let owner: HTTPClientConnection
    private var source: SocketStream?
    private var sink: SocketStream?
    private var client: HTTPServerConnection?
    private var pipe: SplicePipe?
    private let pool: SplicePipePool
    /// Body bytes still to take from the upstream.
    private(set) var remaining: Int
    /// Bytes taken from the upstream that the client's socket has not taken yet.
    private(set) var inPipe = 0
    /// The last splice into the pipe found no room (or an empty socket: splice cannot say which) while the
    /// pipe held bytes: the upstream is not read until the client has taken some.
    private var pipeMayBeFull = false
    private var running = false
    private var pumping = false

    init(owner: HTTPClientConnection, source: SocketStream, client: HTTPServerConnection, pipe: SplicePipe, pool: SplicePipePool, remaining: Int) {
        self.owner = owner
        self.source = source
        self.sink = client.stream
        self.client = client
        self.pipe = pipe
        self.pool = pool
        self.remaining = remaining
    }

    var isRunning: Bool { running }

    /// The client's socket still owes bytes the splice holds (for the send-stall check).
    var holdsBytes: Bool { inPipe > 0 }

    func start() {
        guard let source, let sink else { return }
        running = true
        source.spliceSource = self
        sink.spliceSink = self
        pump()
    }

    // A report may make the owner let go of its connection (and so of this splice) before the call
    // returns: both are kept alive until it does.
    func sourceReadable() { withExtendedLifetime((self, owner)) { pump() } }

    func sinkWritable() { withExtendedLifetime((self, owner)) { pump() } }

    /// Moves bytes both ways until neither socket takes or gives more, then sets the interest accordingly.
    private func pump() {
        guard running, !pumping, let source, let sink, let pipe else { return }
        pumping = true
        defer { pumping = false }
        var sinkBlocked = false
        var sourceDry = false
        while running {
            var progressed = false
            // Bytes queued on the client before the splice began go first: the stream writes them and
            // comes back here when its queue is empty.
            if inPipe > 0 && !sinkBlocked && sink.pendingOutput == 0 {
                let n = transport_splice(pipe.readEnd, sink.fd, inPipe)
                if n > 0 {
                    // The kernel moves at most what was asked; clamped all the same.
                    let moved = min(n, inPipe)
                    inPipe -= moved
                    pipeMayBeFull = false
                    progressed = true
                    client?.bodySpliced(moved)
                } else if n < 0 && errno == EINTR {
                    continue
                } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                    sinkBlocked = true
                } else {
                    return sinkFailed(n < 0 ? errno : EPIPE)
                }
            }
            if remaining > 0 && !sourceDry && !pipeMayBeFull {
                let n = transport_splice(source.fd, pipe.writeEnd, min(remaining, pipe.capacity))
                if n > 0 {
                    let moved = min(n, remaining)
                    remaining -= moved
                    inPipe += moved
                    progressed = true
                    owner.spliceReceived(moved)
                    guard running else { return }
                } else if n == 0 {
                    return sourceEnded()
                } else if errno == EINTR {
                    continue
                } else if errno == EAGAIN || errno == EWOULDBLOCK {
                    if inPipe > 0 { pipeMayBeFull = true } else { sourceDry = true }
                } else {
                    return sourceFailed(errno)
                }
            }
            if remaining == 0 && inPipe == 0 {
                stop()
                owner.spliceFinished()
                return
            }
            if !progressed { break }
        }
        guard running else { return }
        if inPipe > 0 || sink.pendingOutput > 0 { sink.armWrite() } else { sink.disarmWrite() }
        if remaining > 0 && !pipeMayBeFull { source.resumeReading() } else { source.pauseReading() }
        owner.spliceHoldsSource(remaining > 0 && pipeMayBeFull)
    }

    /// The upstream closed before the whole body came: the response is cut short.
    private func sourceEnded() {
        stop()
        owner.spliceSourceEnded()
    }

    private func sourceFailed(_ error: Int32) {
        let source = self.source
        stop()
        source?.fail(error)
    }

    /// The client is gone (reset, broken pipe): its connection fails as a failed write would make it; the
    /// upstream cannot finish this body anywhere, so it is closed and never reused.
    private func sinkFailed(_ error: Int32) {
        let sink = self.sink
        let owner = self.owner
        stop()
        sink?.fail(error)
        owner.spliceLostClient()
    }

    /// One of the two sockets is closing (by its owner, a timeout, a failure elsewhere).
    func streamClosing(_ stream: SocketStream) {
        guard running else { return }
        let lostClient = stream === sink
        let owner = self.owner
        stop()
        if lostClient { owner.spliceLostClient() }
    }

    /// Gives both sockets back to their streams and the pipe to the pool (only if empty: bytes left in
    /// it belong to a body that was cut, and a pipe is never handed on with them). Idempotent.
    func stop() {
        guard running || pipe != nil else { return }
        running = false
        if let sink, sink.spliceSink === self {
            sink.spliceSink = nil
            if sink.pendingOutput == 0 { sink.disarmWrite() }
        }
        if let source, source.spliceSource === self { source.spliceSource = nil }
        source = nil
        sink = nil
        client = nil
        if let pipe {
            if inPipe == 0 { pool.give(pipe) } else { pipe.close() }
        }
        pipe = nil
    }

    deinit {
        stop()
    }
}

/// A non-blocking pipe used as a splice buffer.
struct SplicePipe {
    let readEnd: Int32
    let writeEnd: Int32
    /// Bytes asked for at most per splice into the pipe (its capacity as the kernel reported it).
    let capacity: Int

    func close() {
        Glibc.close(readEnd)
        Glibc.close(writeEnd)
    }
}

/// Empty pipes of one loop, kept for the next spliced body (a pipe costs three system calls to make and
/// two to close; an empty pipe holds no page).
final class SplicePipePool {
    /// What each pipe is asked to hold. Larger pipes mean fewer splices per body; the kernel caps an
    /// unprivileged request at /proc/sys/fs/pipe-max-size (1 MiB by default), and a refusal leaves the
    /// default (64 KiB), which works too.
    static let requestedCapacity = 1 << 20
    private var free: [SplicePipe] = []
    private let maxFree = 8

    func take() -> SplicePipe? {
        if let pipe = free.popLast() { return pipe }
        var fds: (Int32, Int32) = (-1, -1)
        let made = withUnsafeMutableBytes(of: &fds) { raw in
            transport_pipe_nonblocking(raw.baseAddress!.assumingMemoryBound(to: Int32.self))
        }
        guard made == 0 else { return nil }
        var capacity = Int(transport_pipe_set_capacity(fds.1, Int32(Self.requestedCapacity)))
        if capacity <= 0 { capacity = 64 * 1024 }
        return SplicePipe(readEnd: fds.0, writeEnd: fds.1, capacity: capacity)
    }

    func give(_ pipe: SplicePipe) {
        if free.count < maxFree { free.append(pipe) } else { pipe.close() }
    }

    deinit {
        for pipe in free { pipe.close() }
    }
}
