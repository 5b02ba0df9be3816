import CNghttp2
import HTTPWire
import Glibc

/// What an HTTP/2 server connection reports, on the loop's thread.
public protocol HTTP2ServerConnectionHandler: AnyObject {
    /// A stream's request head is complete (`stream.head`); its body, if any, follows through the handler
    /// the receiver sets on the stream. A head the transport refused itself (too large, not mappable to
    /// HTTP/1.1 semantics) is answered by it and never reported.
    func connection(_ connection: HTTP2ServerConnection, opened stream: HTTP2ServerStream)
    /// The connection is closed; every stream still open was reported `streamReset` first.
    func connectionEnded(_ connection: HTTP2ServerConnection)
}

/// HTTP/2 with prior knowledge on an accepted socket (the client's connection preface was seen by the
/// HTTP/1.1 connection, which handed its socket over, see `HTTPServerConnection.takeOverForHTTP2`).
///
/// nghttp2 does the protocol (framing, HPACK, flow control, stream states, the RFC 9113 §8 message
/// rules; docs/nghttp2.md says what we rely on); this class feeds it the socket's bytes and writes what
/// it produces, and turns each request stream into an `HTTP2ServerStream` with the same head type the
/// HTTP/1.1 connection hands out. The limits the product sets per connection:
/// - `maxConcurrentStreams` is announced in SETTINGS and enforced by nghttp2 (a client that opens more
///   once it has acknowledged them gets GOAWAY PROTOCOL_ERROR);
/// - a request's header list over `limits.maxHeadBytes` (counted as RFC 9113 counts it: name, value and 32
///   per field) is answered 431 without being reported;
/// - `idleTimeout`: a connection with no stream open and nothing received for that long is closed with a
///   GOAWAY; one whose response data has waited for a flow-control window that long (a client that
///   never opens its window holds the data and the streams otherwise) is closed too.
public final class HTTP2ServerConnection {
    public struct Settings: Sendable {
        public var maxConcurrentStreams: Int
        public var maxHeadBytes: Int
        public var idleTimeout: Double
        public var sendTimeout: Double
        /// Response bytes buffered per stream above which the stream's `canSendMore` is false.
        public var streamBufferLimit: Int

        public init(maxConcurrentStreams: Int = 100, maxHeadBytes: Int = 64 * 1024, idleTimeout: Double = 60,
                    sendTimeout: Double = 60, streamBufferLimit: Int = 256 * 1024) {
            self.maxConcurrentStreams = maxConcurrentStreams
            self.maxHeadBytes = maxHeadBytes
            self.idleTimeout = idleTimeout
            self.sendTimeout = sendTimeout
            self.streamBufferLimit = streamBufferLimit
        }
    }

    public weak var handler: HTTP2ServerConnectionHandler?
    public let peer: PeerAddress
    public let settings: Settings
    let stream: SocketStream
    private let endpoint: TunnelEndpoint
    private var session: OpaquePointer?
    private var streams: [Int32: HTTP2ServerStream] = [:]
    /// Inside `nghttp2_session_mem_recv` or `mem_send`: nghttp2 must not be re-entered, so output is
    /// written after the call returns.
    private var inLibrary = false
    private var flushWanted = false
    private var checkTimer: TransportTimer?
    /// Output is written once per loop iteration (`scheduleFlush`): the frames of every stream answered
    /// in one iteration share a write instead of a write each.
    private var flushTimer: TransportTimer?
    private var flushScheduled = false
    private var lastInput = monotonicSeconds()
    private var stalledSince: Double?
    private var selfRetain: HTTP2ServerConnection?
    public private(set) var isClosed = false
    /// Streams opened over the connection's life (for a test's or a metric's look).
    public private(set) var streamsOpened = 0

    /// Output queued on the socket above which no more frames are taken from nghttp2 until it drains.
    private let socketOutputLimit = 1 << 20

    public var openStreams: Int { streams.count }

    /// Takes over the socket of `endpoint` and makes the session; `start()` (once the handler is set)
    /// sends our SETTINGS and reads, the bytes that came with the preface first. Retains itself until the
    /// socket is closed.
    public init(loop: TransportLoop, endpoint: TunnelEndpoint, peer: PeerAddress, settings: Settings) {
        self.endpoint = endpoint
        self.stream = endpoint.stream
        self.peer = peer
        self.settings = settings
        endpoint.markUsed()
        selfRetain = self
        stream.owner = self
        stream.sendStallLimit = max(0, settings.sendTimeout)
        if settings.idleTimeout > 0 {
            checkTimer = TransportTimer(loop: loop, repeats: true) { [unowned self] in self.checkActivity() }
        }
        flushTimer = TransportTimer(loop: loop) { [unowned self] in
            self.flushScheduled = false
            self.flush()
        }
        if !HTTP2Session.makeServer(&session, for: self, settings: settings) { session = nil }
    }

    public func start() {
        guard session != nil else { return close() }
        checkTimer?.schedule(after: max(0.05, settings.idleTimeout / 4))
        flush()
        stream.resumeReading()
        if stream.input.count > 0 { streamReceived(stream) }
    }

    deinit {
        stream.ownerLeaving(ObjectIdentifier(self))
        if let session { nghttp2_session_del(session) }
    }

    /// Sends GOAWAY naming the last stream taken (no new stream is accepted; the ones open finish) and
    /// closes when they have: nghttp2 wants neither to read nor to write once GOAWAY is out and no
    /// stream is left. (Not `terminate_session`, which closes as soon as its GOAWAY is sent.)
    public func drain() {
        guard let session, !isClosed else { return }
        _ = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nghttp2_session_get_last_proc_stream_id(session),
                                  UInt32(NGHTTP2_NO_ERROR.rawValue), nil, 0)
        flush()
    }

    /// Closes the socket now; open streams are reported reset.
    public func close() {
        guard !isClosed else { return }
        stream.close()
    }

    // MARK: - nghttp2's reports (called from its callbacks, see HTTP2Session)

    func beginRequest(_ id: Int32) {
        let opened = HTTP2ServerStream(connection: self, id: id, maxHeadBytes: settings.maxHeadBytes)
        streams[id] = opened
        streamsOpened += 1
    }

    func stream(_ id: Int32) -> HTTP2ServerStream? { streams[id] }

    /// A stream's request head is complete: reported unless the transport answered it itself.
    func headComplete(_ opened: HTTP2ServerStream, endStream: Bool) {
        if opened.completeHead(endStream: endStream) {
            handler?.connection(self, opened: opened)
            if endStream { opened.receivedEnd() }
        }
    }

    func streamClosed(_ id: Int32, errorCode: UInt32) {
        guard let closed = streams.removeValue(forKey: id) else { return }
        closed.closed(errorCode: errorCode)
    }

    // MARK: - Output

    /// Writes what nghttp2 has to send, while the socket takes it; then closes if the session is over.
    func flush() {
        guard let session, !isClosed else { return }
        if inLibrary {
            flushWanted = true
            return
        }
        inLibrary = true
        let failed = !HTTP2SessionOutput.write(session, to: stream, limit: socketOutputLimit)
        inLibrary = false
        flushWanted = false
        if failed || HTTP2SessionOutput.isOver(session) {
            if stream.pendingOutput > 0 { stream.closeAfterFlush() } else { close() }
            return
        }
        for open in Array(streams.values) where open.wantsCanSendMore && open.canSendMore {
            open.wantsCanSendMore = false
            open.handler?.streamCanSendMore(open)
        }
    }

    func submit(_ body: (OpaquePointer) -> Void) {
        guard let session, !isClosed else { return }
        body(session)
        scheduleFlush()
    }

    /// Writes at the end of this loop iteration, with whatever else is submitted until then.
    func scheduleFlush() {
        guard !flushScheduled, !isClosed else { return }
        flushScheduled = true
        flushTimer?.schedule(after: 0)
    }

    var sessionForStreams: OpaquePointer? { isClosed ? nil : session }

    var socketHasRoom: Bool { stream.pendingOutput < socketOutputLimit }

    /// The client's flow-control window for `id` (and the connection's), for the stall check.
    private func windowIsClosed(for id: Int32) -> Bool {
        guard let session else { return false }
        return nghttp2_session_get_remote_window_size(session) <= 0 || nghttp2_session_get_stream_remote_window_size(session, id) <= 0
    }

    private func checkActivity() {
        guard !isClosed else { return }
        let now = monotonicSeconds()
        let waiting = streams.values.contains { $0.hasUnsentBody && windowIsClosed(for: $0.id) }
        if waiting {
            if stalledSince == nil { stalledSince = now }
        } else {
            stalledSince = nil
        }
        if let since = stalledSince, now - since >= settings.idleTimeout {
            // A client that never opens its window: its streams and the data they hold are let go.
            return close()
        }
        if streams.isEmpty && now - lastInput >= settings.idleTimeout { return drainOrClose() }
    }

    private func drainOrClose() {
        drain()
        if !isClosed, streams.isEmpty { stream.closeAfterFlush() }
    }

    func consume(_ id: Int32, _ count: Int) {
        guard let session, count > 0, !isClosed else { return }
        _ = nghttp2_session_consume(session, id, count)
        scheduleFlush()
    }
}

extension HTTP2ServerConnection: SocketStreamOwner {
    func streamReceived(_ stream: SocketStream) {
        guard let session, !isClosed else { return }
        lastInput = monotonicSeconds()
        let input = stream.input
        let count = input.count
        inLibrary = true
        let used = input.unconsumed.withMemoryRebound(to: UInt8.self) { nghttp2_session_mem_recv(session, $0.baseAddress, count) }
        inLibrary = false
        if used < 0 {
            // A connection error: nghttp2 has queued its GOAWAY; it goes out, then the socket closes.
            input.consume(count)
            flush()
            if !isClosed { stream.closeAfterFlush() }
            return
        }
        input.consume(min(count, used))
        scheduleFlush()
    }

    func streamReachedEnd(_ stream: SocketStream) { close() }

    func streamFailed(_ stream: SocketStream, errno: Int32) {}

    func streamDrained(_ stream: SocketStream) { flush() }

    func streamClosed(_ stream: SocketStream) {
        guard !isClosed else { return }
        isClosed = true
        checkTimer?.cancel()
        checkTimer = nil
        flushTimer?.cancel()
        flushTimer = nil
        let open = streams
        streams = [:]
        for closed in open.values { closed.closed(errorCode: UInt32(NGHTTP2_CANCEL.rawValue)) }
        endpoint.closedByOwner()
        handler?.connectionEnded(self)
        selfRetain = nil
    }
}
