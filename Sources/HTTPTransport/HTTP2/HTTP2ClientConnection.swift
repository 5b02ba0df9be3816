import CNghttp2
import HTTPWire

/// One HTTP/2 connection to an upstream (h2c with prior knowledge, or h2 over TLS), carrying many
/// request streams (`HTTP2ClientStream`) at once.
///
/// Connecting (resolving, the TCP connect, the TLS handshake) is `HTTPClientConnection`'s, which hands
/// its socket over once it is up (`detachConnected`); from there nghttp2 does the protocol and this class
/// feeds it the socket's bytes and writes what it produces, once per loop iteration. The pool
/// (`HTTP2UpstreamPool`) is told when the server's first SETTINGS arrived (`onReady`: from then on
/// `peerMaxStreams` is the server's word), when a stream closed (`onStreamClosed`), and when the
/// connection is gone (`onClosed`).
///
/// GOAWAY from the server: no new stream is started on the connection; streams above its last-stream-id
/// were not processed by the server and end as `.notProcessed` (their requests can go again on another
/// connection, whatever their method); the others finish.
public final class HTTP2ClientConnection {
    public struct Settings: Sendable {
        /// Streams we open at most at once, whatever the server allows.
        public var maxStreams: Int
        public var maxHeadBytes: Int
        /// Response bytes buffered per stream for sending above which `canSendMore` is false.
        public var streamBufferLimit: Int

        public init(maxStreams: Int = 100, maxHeadBytes: Int = 256 * 1024, streamBufferLimit: Int = 256 * 1024) {
            self.maxStreams = max(1, maxStreams)
            self.maxHeadBytes = maxHeadBytes
            self.streamBufferLimit = streamBufferLimit
        }
    }

    public let host: String
    public let settings: Settings
    /// "http" or "https", for `:scheme`.
    let scheme: String
    private var connector: HTTPClientConnection?
    private var endpoint: TunnelEndpoint?
    private var stream: SocketStream?
    private var session: OpaquePointer?
    private var streams: [Int32: HTTP2ClientStream] = [:]
    private var inLibrary = false
    private var flushTimer: TransportTimer?
    /// Checks the streams' silence limits while any stream has one (`watchSilence`).
    private var silenceTimer: TransportTimer?
    private var silenceInterval = Double.infinity
    let loop: TransportLoop
    private var flushScheduled = false
    private var selfRetain: HTTP2ClientConnection?
    private let socketOutputLimit = 1 << 20

    public private(set) var isReady = false
    public private(set) var isClosed = false
    /// The server sent GOAWAY: no new stream goes on this connection.
    public private(set) var isGoingAway = false
    private var goAwayLastStreamID: Int32 = .max
    /// Streams handed out and not closed yet (started or about to be).
    public private(set) var activeStreams = 0
    public private(set) var streamsStarted = 0
    public private(set) var lastUsed = monotonicSeconds()
    /// Why the connection failed before it was up (for the waiting requests' failure).
    public private(set) var connectFailure: String?

    var onReady: (() -> Void)?
    var onStreamClosed: (() -> Void)?
    var onClosed: (() -> Void)?

    /// Over TLS, the server did not select `h2` in ALPN (`http1Allowed` was true): the connection was
    /// closed without a frame, and the upstream is to be spoken to over HTTP/1.1.
    public private(set) var serverChoseHTTP1 = false
    private let http1Allowed: Bool

    /// Starts connecting. Over TLS (`tls`), `h2` is offered in ALPN, with `http/1.1` beside it when
    /// `http1Allowed` (then a server that selects anything but `h2` ends the connection as
    /// `serverChoseHTTP1`); without it the connection speaks HTTP/2 whatever the server selected.
    public init(loop: TransportLoop, host: String, port: UInt16, tls: TransportTLSClientContext?, connectTimeout: Double?,
                settings: Settings, http1Allowed: Bool = false) {
        self.host = host
        self.settings = settings
        self.http1Allowed = http1Allowed
        self.loop = loop
        scheme = tls == nil ? "http" : "https"
        selfRetain = self
        flushTimer = TransportTimer(loop: loop) { [unowned self] in
            self.flushScheduled = false
            // A connect that failed inside `init` is reported from the loop, never from inside it.
            if self.stream == nil && self.connector == nil { return self.closedBeforeUp() }
            self.flush()
        }
        do {
            let connector = try HTTPClientConnection(loop: loop, host: host, port: port, tls: tls, connectTimeout: connectTimeout,
                                                     alpn: tls == nil ? [] : (http1Allowed ? ["h2", "http/1.1"] : ["h2"]))
            self.connector = connector
            connector.handler = ConnectReports(self)
            connector.onConnected = { [unowned self] in self.connected() }
        } catch {
            connectFailure = error.description
            flushScheduled = true
            flushTimer?.schedule(after: 0)
        }
    }

    deinit {
        if let stream { stream.ownerLeaving(ObjectIdentifier(self)) }
        if let session { nghttp2_session_del(session) }
    }

    /// Streams the server lets us open at once (its SETTINGS_MAX_CONCURRENT_STREAMS), within ours.
    public var peerMaxStreams: Int {
        guard let session else { return settings.maxStreams }
        let remote = Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
        return min(settings.maxStreams, remote)
    }

    /// Whether another stream may start here now.
    public var hasRoom: Bool { isReady && !isGoingAway && !isClosed && activeStreams < peerMaxStreams }

    /// A new stream on this connection; the caller starts its request (`startRequest`) or gives it back
    /// (`abandon`). The pool calls this only while `hasRoom`.
    func makeStream() -> HTTP2ClientStream {
        activeStreams += 1
        lastUsed = monotonicSeconds()
        return HTTP2ClientStream(connection: self)
    }

    /// Closes the socket now; open streams end as lost (or not processed, above a GOAWAY's last id).
    public func close() {
        guard !isClosed else { return }
        if let stream { stream.close() } else { closedBeforeUp() }
    }

    /// Sends GOAWAY; the open streams finish, then the connection closes.
    public func drain() {
        guard let session, !isClosed else { return }
        _ = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, UInt32(NGHTTP2_NO_ERROR.rawValue), nil, 0)
        isGoingAway = true
        scheduleFlush()
    }

    // MARK: - Connecting

    private func connected() {
        guard let connector, let endpoint = connector.detachConnected() else { return }
        self.connector = nil
        if http1Allowed && scheme == "https" && endpoint.stream.selectedProtocol != "h2" {
            serverChoseHTTP1 = true
            connectFailure = "the upstream selected \(endpoint.stream.selectedProtocol ?? "no protocol") in ALPN, not h2"
            self.endpoint = endpoint
            endpoint.markUsed()
            self.stream = endpoint.stream
            endpoint.stream.owner = self
            return endpoint.stream.close()
        }
        self.endpoint = endpoint
        endpoint.markUsed()
        let stream = endpoint.stream
        self.stream = stream
        stream.owner = self
        guard HTTP2UpstreamSession.make(&session, for: self, maxStreams: settings.maxStreams) else {
            session = nil
            return stream.close()
        }
        flush()
    }

    fileprivate func connectEnded(_ reason: String) {
        guard !isClosed, stream == nil else { return }
        connectFailure = reason
        connector = nil
        closedBeforeUp()
    }

    private func closedBeforeUp() {
        guard !isClosed else { return }
        connector?.handler = nil
        connector?.close()
        connector = nil
        finishClosing()
    }

    // MARK: - Streams

    func stream(_ id: Int32) -> HTTP2ClientStream? { streams[id] }

    /// Submits a stream's request; false if nghttp2 refused it (the stream is then ended as not processed).
    func submit(_ opened: HTTP2ClientStream, fields: HTTP2FieldList, hasBody: Bool) -> Bool {
        guard let session, !isClosed, !isGoingAway else { return false }
        var id: Int32 = -1
        fields.withNameValues { nva, count in
            if hasBody {
                var source = nghttp2_data_provider()
                source.read_callback = HTTP2UpstreamSession.readBody
                id = nghttp2_submit_request(session, nil, nva, count, &source, nil)
            } else {
                id = nghttp2_submit_request(session, nil, nva, count, nil, nil)
            }
        }
        guard id > 0 else { return false }
        opened.id = id
        streams[id] = opened
        streamsStarted += 1
        scheduleFlush()
        return true
    }

    /// A stream handed out is done with (closed, or never started).
    func streamReleased() {
        activeStreams -= 1
        lastUsed = monotonicSeconds()
        onStreamClosed?()
    }

    func streamClosed(_ id: Int32, errorCode: UInt32) {
        guard let closed = streams.removeValue(forKey: id) else { return }
        let notProcessed = errorCode == NGHTTP2_REFUSED_STREAM.rawValue || id > goAwayLastStreamID
        closed.closed(errorCode: errorCode, notProcessed: notProcessed)
    }

    func settingsReceived() {
        guard !isReady else { return }
        isReady = true
        onReady?()
    }

    func goAwayReceived(lastStreamID: Int32) {
        isGoingAway = true
        goAwayLastStreamID = min(goAwayLastStreamID, lastStreamID)
        // The pool stops handing out streams here and opens another connection for the waiting ones.
        onStreamClosed?()
    }

    func consume(_ id: Int32, _ count: Int) {
        guard let session, count > 0, !isClosed else { return }
        if streams[id] != nil {
            _ = nghttp2_session_consume(session, id, count)
        } else {
            _ = nghttp2_session_consume_connection(session, count)
        }
        scheduleFlush()
    }

    func submitControl(_ body: (OpaquePointer) -> Void) {
        guard let session, !isClosed else { return }
        body(session)
        scheduleFlush()
    }

    var sessionForStreams: OpaquePointer? { isClosed ? nil : session }

    var socketHasRoom: Bool { (stream?.pendingOutput ?? 0) < socketOutputLimit }

    // MARK: - Silence limits

    /// A stream has a silence limit of `limit` seconds: the check runs every quarter of the shortest.
    func watchSilence(_ limit: Double) {
        guard !isClosed else { return }
        let interval = max(0.05, limit / 4)
        if silenceTimer == nil { silenceTimer = TransportTimer(loop: loop) { [unowned self] in self.checkSilence() } }
        guard let silenceTimer else { return }
        if !silenceTimer.isScheduled || interval < silenceInterval {
            silenceInterval = interval
            silenceTimer.schedule(after: interval)
        }
    }

    private func checkSilence() {
        guard !isClosed else { return }
        let now = monotonicSeconds()
        var watching = false
        for open in Array(streams.values) {
            // A paused stream is not watched (`HTTP2ClientStream.pauseReading`); its resume watches it again.
            guard let limit = open.silenceLimit, !open.isEnded, !open.isReadingPaused else { continue }
            if now - open.lastInput >= limit { open.silenceExpired() } else { watching = true }
        }
        if watching { silenceTimer?.schedule(after: silenceInterval) } else { silenceInterval = .infinity }
    }

    // MARK: - Output

    func scheduleFlush() {
        guard !flushScheduled, !isClosed else { return }
        flushScheduled = true
        flushTimer?.schedule(after: 0)
    }

    private func flush() {
        guard let session, let stream, !isClosed, !inLibrary else { return }
        inLibrary = true
        let failed = !HTTP2SessionOutput.write(session, to: stream, limit: socketOutputLimit)
        inLibrary = false
        if failed || HTTP2SessionOutput.isOver(session) {
            if stream.pendingOutput > 0 { stream.closeAfterFlush() } else { stream.close() }
            return
        }
        for open in Array(streams.values) where open.wantsCanSendMore && open.canSendMore {
            open.wantsCanSendMore = false
            open.handler?.streamCanSendMore(open)
        }
    }

    private func failOpenStreams() {
        let open = streams
        streams = [:]
        for lost in open.values.sorted(by: { $0.id < $1.id }) {
            lost.closed(errorCode: UInt32(NGHTTP2_CANCEL.rawValue), notProcessed: lost.id > goAwayLastStreamID, connectionLost: true)
        }
    }

    private func finishClosing() {
        isClosed = true
        isGoingAway = true
        flushTimer?.cancel()
        flushTimer = nil
        silenceTimer?.cancel()
        silenceTimer = nil
        failOpenStreams()
        endpoint?.closedByOwner()
        let told = onClosed
        onClosed = nil
        told?()
        onReady = nil
        onStreamClosed = nil
        selfRetain = nil
    }
}

extension HTTP2ClientConnection: SocketStreamOwner {
    func streamReceived(_ stream: SocketStream) {
        guard let session, !isClosed else { return }
        let input = stream.input
        let count = input.count
        inLibrary = true
        let used = input.unconsumed.withMemoryRebound(to: UInt8.self) { nghttp2_session_mem_recv(session, $0.baseAddress, count) }
        inLibrary = false
        input.consume(count)
        if used < 0 {
            // A connection error (the server broke the protocol): nghttp2 has queued its GOAWAY. The open
            // streams fail now, not when the socket's lingering close ends (2 s for a server that stays).
            isGoingAway = true
            flush()
            if !isClosed {
                failOpenStreams()
                stream.closeAfterFlush()
            }
            return
        }
        scheduleFlush()
    }

    func streamReachedEnd(_ stream: SocketStream) { stream.close() }

    func streamFailed(_ stream: SocketStream, errno: Int32) { stream.close() }

    func streamDrained(_ stream: SocketStream) { flush() }

    func streamClosed(_ stream: SocketStream) {
        guard !isClosed else { return }
        finishClosing()
    }
}

/// The connector's reports before its socket is handed over: only its end matters (a failed connect).
private final class ConnectReports: HTTPClientConnectionHandler {
    private weak var owner: HTTP2ClientConnection?

    init(_ owner: HTTP2ClientConnection) { self.owner = owner }

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {}
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {}
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        let reason: String
        switch ended {
        case .connectFailed(let text): reason = text
        default: reason = "connection closed before it was up"
        }
        owner?.connectEnded(reason)
    }
}
