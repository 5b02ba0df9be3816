import CLibevent
import HTTPWire
import Glibc

/// What a server connection reports, in order, on the loop's thread: a head, its body in pieces, its end;
/// then (once the response is finished) the next request of a pipeline or keep-alive connection.
public protocol HTTPServerConnectionHandler: AnyObject {
    /// The head is the handler's to keep (`consuming`: a handler that stores it moves it, with no copy).
    func connection(_ connection: HTTPServerConnection, receivedHead head: consuming ReceivedRequestHead)
    /// A piece of the request body (de-chunked). Valid only during the call.
    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer)
    func connectionReceivedEnd(_ connection: HTTPServerConnection)
    /// Response bytes that had to wait have been written: the sender may produce more.
    func connectionCanSendMore(_ connection: HTTPServerConnection)
    /// The connection is gone; nothing more will be reported and sending is a no-op.
    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd)
    /// The connection's first bytes are HTTP/2's connection preface (prior knowledge, RFC 9113 §3.3) and
    /// `detectsHTTP2Preface` is set: the handler takes the socket with `takeOverForHTTP2()`, or the bytes
    /// are parsed as HTTP/1.1 (and refused).
    func connectionSentHTTP2Preface(_ connection: HTTPServerConnection)
}

extension HTTPServerConnectionHandler {
    public func connectionSentHTTP2Preface(_ connection: HTTPServerConnection) {}
}

/// One client connection on the server side: parses requests with HTTPWire as bytes arrive, answers
/// protocol errors itself, and frames the responses its handler sends.
///
/// One request at a time: the head of a pipelined request is parsed only after the previous response is
/// finished, so responses can never be sent in the wrong order or to the wrong request.
///
/// `Expect: 100-continue` is never answered by the transport: the handler decides, and calls
/// `sendContinue()` when it wants the body (or answers with a final status and the connection closes after
/// it, since the unread body cannot be told apart from a next request). `pauseReading()` holds the request
/// body back (an upload relayed to a slower upstream); the socket's receive window then pushes back on
/// the client.
public final class HTTPServerConnection {
    // State the extensions in HTTPServerConnection+Receiving/+Sending/+Timers.swift read and set is internal,
    // not private (a `private` member is visible only in this file); nothing outside the connection sets it.
    public let peer: PeerAddress
    /// Held strongly until the connection has ended (reported `ended`, or its socket is closed), then let
    /// go. Not `weak`: a weak reference gives the handler a side table, which makes every retain and
    /// release of it slow, and a handler is touched several times per request. A handler that holds its
    /// connection forms a cycle only while the connection lives; the end breaks it on every path (see
    /// `end` and `releaseFromServer`).
    public var handler: HTTPServerConnectionHandler?
    /// Pending output above which `canSendMore` is false (the sender should wait for `connectionCanSendMore`).
    public var sendBufferLimit = 1 << 20
    /// A client that closes its sending side once its response has started has left (the default keeps
    /// answering, as a half-close allows). A proxy sets this: a FIN cannot tell a half-close from a client
    /// that gave up, and a response that streams for ever (events) to a client that gave up would hold
    /// its upstream request until the next write failed. Before the response starts, a request that
    /// arrived whole is still answered (a client may shut down its write side and wait for the answer);
    /// a client that did leave is noticed when that answer is written.
    public var halfCloseEndsTheConnection = false
    /// The client closed its sending side after a whole request, before its answer started, and the
    /// connection was kept for that answer (`halfCloseEndsTheConnection`).
    public internal(set) var peerHalfClosed = false
    /// Look for HTTP/2's connection preface before the first request (see `connectionSentHTTP2Preface`).
    public var detectsHTTP2Preface = false
    /// A request head has been parsed on this connection (the preface can only come first).
    var sawRequestHead = false
    /// Close the connection after the response now being started (a refusal after which the next
    /// request's start cannot be trusted, or a server that is shutting down).
    public var closeAfterResponse = false

    let stream: SocketStream
    /// A response head not written yet (empty when there is none): it goes out with the first body piece
    /// (one write instead of two). The buffer keeps its capacity for the next head. Not in the scratch:
    /// every response uses it three times, and reaching it through the scratch cost a retain and a
    /// release each (about 200 instructions per request); its storage is made with the first head.
    let pendingHead = HeadBuffer()
    /// Parser, parsed head and decoder, made when first needed (see `RequestScratch`).
    private(set) var scratchIfMade: RequestScratch?
    var scratch: RequestScratch {
        if let scratchIfMade { return scratchIfMade }
        let made = RequestScratch(limits: limits)
        scratchIfMade = made
        return made
    }
    /// The server's settings when this connection was accepted, shared with the others accepted under
    /// them: an idle client connection should not carry its own copy of the limits and the refusal.
    let fixed: FixedSettings
    var limits: HTTPWireLimits { fixed.limits }
    /// The server's connection-limit bookkeeping (see `HTTPServer`), told once when the socket is closed.
    /// `unowned` rather than weak (no side table on the server): the server lets go of the connection
    /// (`detachFromServer`) when the socket closes and when the server closes, deinit included, so this
    /// never outlives it.
    unowned var server: HTTPServer?
    let sequence: UInt64
    var isOverLimit = false
    var isRefusedOverLimit = false
    /// When a byte last arrived or the last response was finished: what idleness is measured from.
    var quietSince: Double

    enum ReadState {
        case head
        case lengthBody(remaining: Int)
        case chunkedBody
        /// The request is complete; wait for its response before parsing more.
        case awaitingResponse
        case ended
    }
    var readState = ReadState.head
    var responseFraming: ResponseFraming?
    var requestVersion = HTTPVersion.http11
    /// A response to HEAD carries the framing fields of the would-be body but never its bytes.
    var requestIsHead = false
    var requestKeepAlive = true
    var responseCloses = false
    /// Body bytes still owed under a known length: more are never sent (the client would take them for
    /// the next response), fewer end the connection (the client would wait for them).
    var bodyOwed = 0
    var processing = false
    var hasEnded = false
    /// The handler asked for no more request bytes until `resumeReading()`.
    var readingPausedByHandler = false
    var requestExpectsContinue = false
    var continueSent = false
    /// Body bytes of the current request delivered so far (for the hard cap).
    var bodyReceived = 0
    /// The current request may switch protocols (see `requestAsksForUpgrade`).
    var upgradeRequested = false

    /// Seconds from the first byte of a request head to its last; 0 = no bound.
    var headTimeout: Double { fixed.headTimeout }
    var headTimer: OpaquePointer?
    let loopBase: OpaquePointer
    var headTimerArmed = false
    /// When the incomplete request head now arriving sent its first byte (`.infinity` while none is).
    var headStartedAt = Double.infinity
    var idleTimeout: Double { fixed.idleTimeout }
    var bodyTimeout: Double { fixed.bodyTimeout }
    var maxBodyBytes: Int { fixed.maxBodyBytes }
    /// One timer for the idle keep-alive limit and the body stall limit. Reads only store `quietSince`;
    /// the timer checks it when it fires and re-arms for the rest, so a busy connection costs no timer
    /// change per read.
    var activityTimer: OpaquePointer?
    /// When the pending expiry of `activityTimer` comes (monotonic seconds); infinity when none is pending.
    var activityExpiry = Double.infinity

    /// The settings a connection keeps for its whole life (`HTTPServer.settings` changes apply to later
    /// connections).
    final class FixedSettings {
        let limits: HTTPWireLimits
        let headTimeout: Double
        let idleTimeout: Double
        let bodyTimeout: Double
        let maxBodyBytes: Int
        let overLimitResponse: HTTPResponseHead
        let overLimitBody: [UInt8]

        init(_ settings: HTTPServer.Settings) {
            limits = settings.limits
            headTimeout = settings.headTimeout
            idleTimeout = settings.idleTimeout
            bodyTimeout = settings.bodyTimeout
            maxBodyBytes = max(0, settings.maxBodyBytes)
            overLimitResponse = settings.overLimitResponse
            overLimitBody = settings.overLimitBody
        }
    }

    init(loop: TransportLoop, fd: Int32, peer: PeerAddress, settings: HTTPServer.Settings, fixed: FixedSettings, sequence: UInt64) {
        self.peer = peer
        self.fixed = fixed
        loopBase = loop.base
        self.sequence = sequence
        quietSince = monotonicSeconds()
        stream = SocketStream(loop: loop, fd: fd, inputCapacity: max(settings.inputCapacity, fixed.limits.maxHeadBytes))
        stream.owner = self
        stream.sendStallLimit = max(0, settings.sendTimeout)
        let context = Unmanaged.passUnretained(self).toOpaque()
        // The head timer is made with the first byte of a head (`armHeadTimer`): a client that connects
        // and stays silent holds one timer, not two.
        if idleTimeout > 0 || bodyTimeout > 0 {
            activityTimer = event_new(loop.base, -1, 0, activityTimerTrampoline, context)
        }
        armActivityTimer()
    }

    deinit {
        stream.ownerLeaving(ObjectIdentifier(self))
        if let headTimer { event_free(headTimer) }
        if let activityTimer { event_free(activityTimer) }
    }

    /// No request in progress, nothing buffered either way: the connection may be closed without losing
    /// anything (to make room at the connection limit, or after the idle timeout).
    var isIdle: Bool {
        guard !hasEnded, !stream.isClosed, case .head = readState else { return false }
        return stream.input.count == 0 && responseFraming == nil && stream.pendingOutput == 0
    }

    /// Bytes have arrived that the connection has not read yet: it looks idle, but a request may be on its
    /// way, its read event not yet run this loop turn. One non-blocking peek (only when a connection is
    /// about to be closed at once to make room, see `HTTPServer.Settings.evictsQuietAtOnce`).
    var hasUnreadBytes: Bool {
        var byte: UInt8 = 0
        return recv(stream.fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) > 0
    }

    /// Whether a response is being sent (started and not finished).
    public var isResponding: Bool { responseFraming != nil }

    /// The current request asked for `100 Continue` and has not had it (nor a final response).
    public var awaitsContinue: Bool {
        guard requestExpectsContinue, !continueSent, responseFraming == nil, !hasEnded else { return false }
        switch readState {
        case .lengthBody, .chunkedBody: return true
        default: return false
        }
    }

    /// Writes `HTTP/1.1 100 Continue` once, and only while `awaitsContinue`: the handler has decided it
    /// wants the body (RFC 9110 section 10.1.1). An HTTP/1.0 request never expects it.
    public func sendContinue() {
        guard awaitsContinue else { return }
        continueSent = true
        stream.write(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8))
    }

    /// Stops delivering request bytes (body pieces, and the next request of a pipeline) until
    /// `resumeReading()`: the socket is no longer read, so the client is held back by TCP flow control.
    /// At most what one read had already buffered is still delivered. Time while paused does not count
    /// towards the body timeout.
    public func pauseReading() {
        guard !readingPausedByHandler, !hasEnded else { return }
        readingPausedByHandler = true
        stream.pauseReading()
        armActivityTimer()
    }

    public func resumeReading() {
        guard readingPausedByHandler, !hasEnded else { return }
        readingPausedByHandler = false
        quietSince = monotonicSeconds()
        stream.resumeReading()
        process()
        armActivityTimer()
    }

    public var isReadingPaused: Bool { readingPausedByHandler }

    /// While the handler holds reading back, the loop does not watch the socket (its read event is off,
    /// or a body waiting in it would wake the loop for ever), so a client that leaves then is not noticed
    /// by itself. This asks the kernel once, without waiting (poll(2) for a hang-up or a closed read side):
    /// a client that reset, or closed its sending side where a half-close ends the connection, is ended
    /// as a read would have ended it (`peerClosed`, reported to the handler before this returns true).
    /// Asked by a handler about to act for a client it has held back, e.g. before sending a held upload's
    /// request head upstream for a body that can no longer come.
    public func endIfPeerLeftWhilePaused() -> Bool {
        guard readingPausedByHandler, !hasEnded, !stream.isClosed else { return false }
        let readSideClosed: Int16 = 0x2000   // POLLRDHUP (Linux)
        var entry = pollfd(fd: stream.fd, events: readSideClosed, revents: 0)
        guard poll(&entry, 1, 0) == 1 else { return false }
        let hungUp = entry.revents & Int16(truncatingIfNeeded: POLLHUP | POLLERR) != 0
        guard hungUp || (entry.revents & readSideClosed != 0 && halfCloseEndsTheConnection) else { return false }
        end(.peerClosed)
        stream.close()
        return true
    }

    /// Ends the connection as a read of its end would have (`peerClosed`, reported to the handler before
    /// this returns true) if its client half-closed while its answer was awaited. For a handler that is
    /// about to act again for a request it only held (a FIN cannot tell a half-close from a client that
    /// left).
    public func endIfPeerHalfClosed() -> Bool {
        guard peerHalfClosed, !hasEnded, !stream.isClosed else { return false }
        end(.peerClosed)
        stream.close()
        return true
    }

    public var canSendMore: Bool { stream.pendingOutput < sendBufferLimit }

    /// Reports the end to the handler. The server lets go of the connection only when its socket is
    /// closed, which after an error answer is later (lingering), not here.
    func end(_ reason: ConnectionEnd) {
        guard !hasEnded else { return }
        hasEnded = true
        readState = .ended
        if let activityTimer { event_del(activityTimer) }
        activityExpiry = .infinity
        handler?.connection(self, ended: reason)
        // Nothing more is reported: the handler (and any cycle through it) is let go.
        handler = nil
        if stream.isClosed { releaseFromServer() }
    }

    /// The socket is closed: the server's slot frees (once), and the handler is let go if an upgrade's
    /// tunnel ended without a report to it.
    func releaseFromServer() {
        handler = nil
        let server = self.server
        detachFromServer()
        server?.closed(self)
    }

    /// The server forgets this connection, or this connection its server.
    func detachFromServer() {
        server = nil
    }
}
