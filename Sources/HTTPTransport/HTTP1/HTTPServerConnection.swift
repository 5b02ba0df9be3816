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
extension HTTPServerConnectionHandler {
    public func connectionSentHTTP2Preface(_ connection: HTTPServerConnection) {}
}

public final class HTTPServerConnection {
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
    public private(set) var peerHalfClosed = false
    /// Look for HTTP/2's connection preface before the first request (see `connectionSentHTTP2Preface`).
    public var detectsHTTP2Preface = false
    /// A request head has been parsed on this connection (the preface can only come first).
    private var sawRequestHead = false
    /// Close the connection after the response now being started (a refusal after which the next
    /// request's start cannot be trusted, or a server that is shutting down).
    public var closeAfterResponse = false

    let stream: SocketStream
    /// A response head not written yet (empty when there is none): it goes out with the first body piece
    /// (one write instead of two). The buffer keeps its capacity for the next head. Not in the scratch:
    /// every response uses it three times, and reaching it through the scratch cost a retain and a
    /// release each (about 200 instructions per request); its storage is made with the first head.
    private let pendingHead = HeadBuffer()
    /// Parser, parsed head and decoder, made when first needed (see `RequestScratch`).
    private(set) var scratchIfMade: RequestScratch?
    private var scratch: RequestScratch {
        if let scratchIfMade { return scratchIfMade }
        let made = RequestScratch(limits: limits)
        scratchIfMade = made
        return made
    }
    /// The server's settings when this connection was accepted, shared with the others accepted under
    /// them: an idle client connection should not carry its own copy of the limits and the refusal.
    private let fixed: FixedSettings
    private var limits: HTTPWireLimits { fixed.limits }
    /// The server's connection-limit bookkeeping (see `HTTPServer`), told once when the socket is closed.
    /// `unowned` rather than weak (no side table on the server): the server lets go of the connection
    /// (`detachFromServer`) when the socket closes and when the server closes, deinit included, so this
    /// never outlives it.
    unowned var server: HTTPServer?
    let sequence: UInt64
    var isOverLimit = false
    var isRefusedOverLimit = false
    /// When a byte last arrived or the last response was finished: what idleness is measured from.
    private(set) var quietSince: Double

    private enum ReadState {
        case head
        case lengthBody(remaining: Int)
        case chunkedBody
        /// The request is complete; wait for its response before parsing more.
        case awaitingResponse
        case ended
    }
    private var readState = ReadState.head
    private var responseFraming: ResponseFraming?
    private var requestVersion = HTTPVersion.http11
    /// A response to HEAD carries the framing fields of the would-be body but never its bytes.
    private var requestIsHead = false
    private var requestKeepAlive = true
    private var responseCloses = false
    /// Body bytes still owed under a known length: more are never sent (the client would take them for
    /// the next response), fewer end the connection (the client would wait for them).
    private var bodyOwed = 0
    private var processing = false
    private var hasEnded = false
    /// The handler asked for no more request bytes until `resumeReading()`.
    private var readingPausedByHandler = false
    private var requestExpectsContinue = false
    private var continueSent = false
    /// Body bytes of the current request delivered so far (for the hard cap).
    private var bodyReceived = 0
    /// The current request may switch protocols (see `requestAsksForUpgrade`).
    private var upgradeRequested = false

    /// Seconds from the first byte of a request head to its last; 0 = no bound.
    private var headTimeout: Double { fixed.headTimeout }
    private var headTimer: OpaquePointer?
    private let loopBase: OpaquePointer
    private var headTimerArmed = false
    /// When the incomplete request head now arriving sent its first byte (`.infinity` while none is).
    private var headStartedAt = Double.infinity
    private var idleTimeout: Double { fixed.idleTimeout }
    private var bodyTimeout: Double { fixed.bodyTimeout }
    private var maxBodyBytes: Int { fixed.maxBodyBytes }
    /// One timer for the idle keep-alive limit and the body stall limit. Reads only store `quietSince`;
    /// the timer checks it when it fires and re-arms for the rest, so a busy connection costs no timer
    /// change per read.
    private var activityTimer: OpaquePointer?
    /// When the pending expiry of `activityTimer` comes (monotonic seconds); infinity when none is pending.
    private var activityExpiry = Double.infinity

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

    /// Schedules the activity timer for the limit the current state is under. In other states (a request
    /// waiting for its response: how long the handler takes is the handler's business; reading paused by
    /// the handler) a pending expiry is left alone and ignored when it fires, which saves a timer change
    /// per request; the next state that has a limit re-arms it.
    private func armActivityTimer() {
        guard let activityTimer, !hasEnded else { return }
        let limit: Double
        switch readState {
        case .head where idleTimeout > 0: limit = idleTimeout
        case .lengthBody where bodyTimeout > 0 && !readingPausedByHandler, .chunkedBody where bodyTimeout > 0 && !readingPausedByHandler:
            limit = bodyTimeout
        default:
            return
        }
        // An earlier expiry already pending serves as well: it finds the connection not quiet long enough
        // and re-arms for the rest. A keep-alive client then costs no timer change per request.
        let expiry = quietSince + limit
        if activityExpiry <= expiry { return }
        var tv = clampedTimeval(expiry - monotonicSeconds())
        event_add(activityTimer, &tv)
        activityExpiry = expiry
    }

    func activityTimerFired() {
        activityExpiry = .infinity
        guard !hasEnded else { return }
        let quiet = monotonicSeconds() - quietSince
        switch readState {
        case .head where idleTimeout > 0:
            if responseFraming != nil || stream.pendingOutput > 0 {
                // The last answer is still going out: idleness starts when it is gone.
                quietSince = monotonicSeconds()
            } else if stream.input.count > 0 && headTimeout > 0 {
                return   // a head in progress: the head timeout bounds it
            } else if quiet >= idleTimeout {
                readState = .ended
                disarmHeadTimer()
                end(.idleTimeout)
                stream.close()
                return
            }
            armActivityTimer()
        case .lengthBody, .chunkedBody:
            guard bodyTimeout > 0, !readingPausedByHandler else { return }
            if quiet >= bodyTimeout {
                refuse(status: 408, reason: "Request Timeout", message: "request body stalled", end: .timedOut)
                return
            }
            armActivityTimer()
        default:
            return
        }
    }

    /// For tests: the head timer has been made (with the first byte of a head that came in parts).
    var holdsHeadTimer: Bool { headTimer != nil }

    /// The whole head must arrive within `headTimeout` of its first byte, however the bytes trickle in: a
    /// client sending one byte a second would otherwise hold a connection (and a slot) for as long as it
    /// likes. A timer is a heap entry in libevent, not an epoll change, so arming it per request is cheap.
    private func armHeadTimer() {
        guard headTimeout > 0, !headTimerArmed else { return }
        if headTimer == nil {
            headTimer = event_new(loopBase, -1, 0, headTimerTrampoline, Unmanaged.passUnretained(self).toOpaque())
        }
        guard let headTimer else { return }
        headTimerArmed = true
        headStartedAt = monotonicSeconds()
        let whole = headTimeout.rounded(.down)
        var tv = timeval(tv_sec: Int(whole), tv_usec: Int((headTimeout - whole) * 1_000_000))
        event_add(headTimer, &tv)
    }

    private func disarmHeadTimer() {
        guard let headTimer, headTimerArmed else { return }
        headTimerArmed = false
        headStartedAt = .infinity
        event_del(headTimer)
    }

    /// A request head began arriving at least `grace` seconds ago and is still incomplete, with nothing
    /// being answered. A real client sends its head at once, so at the connection limit such a connection
    /// is the first to make room: otherwise a few connections trickling heads (each within the head
    /// timeout) would hold every slot and lock real clients out for as long as they keep reconnecting.
    func headStalled(now: Double, grace: Double) -> Bool {
        guard headTimerArmed, !hasEnded, case .head = readState, responseFraming == nil, stream.pendingOutput == 0 else { return false }
        return now - headStartedAt >= grace
    }

    /// When the head started arriving (see `headStalled`).
    var headStartTime: Double { headStartedAt }

    /// Answers 408 to a stalled head and closes at once: the slot must be free when this returns.
    func closeStalledHead() {
        refuse(status: 408, reason: "Request Timeout", message: "request head not received in time", end: .headTimeout, lingering: false)
    }

    func headTimerFired() {
        headTimerArmed = false
        guard !hasEnded, case .head = readState, stream.input.count > 0 else { return }
        refuse(status: 408, reason: "Request Timeout", message: "request head not received in time", end: .headTimeout)
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

    // MARK: - Sending

    /// Starts the response to the current request. With `.known(n)`, exactly n body bytes must follow;
    /// `.none` is for responses that have no body by definition (to HEAD, 1xx, 204, 304).
    public func startResponse(_ response: HTTPResponseHead, body: BodyLength) {
        withBytes(of: response.reason) { reason in
            startResponse(status: response.status, reason: reason, body: body) { block in
                for field in response.fields { block.append(name: field.name, value: field.value) }
            }
        }
    }

    /// Starts the response with the fields `fields` writes straight into the head (see `HTTPFieldBlock`);
    /// `reason` is the reason phrase's bytes (controls are dropped).
    public func startResponse(status: Int, reason: UnsafeRawBufferPointer, body: BodyLength, fields: (inout HTTPFieldBlock) -> Void) {
        guard !hasEnded, responseFraming == nil else { return }
        let framing: ResponseFraming
        switch body {
        case .none: framing = .none
        case .known(let n): framing = .length(n)
        case .unknown: framing = requestVersion == .http11 ? .chunked : .closeDelimited
        }
        // Close after the response if the client asked, if only the close can end the body, or if the
        // request body has not been read to its end (its rest would be taken for the next request).
        var bodyUnread = false
        switch readState {
        case .lengthBody, .chunkedBody: bodyUnread = true
        default: break
        }
        // And while connections wait over the limit, so that a slot frees.
        responseCloses = closeAfterResponse || !requestKeepAlive || framing == .closeDelimited || bodyUnread || (server?.wantsSlotsBack ?? false)
        responseFraming = framing
        if case .length(let n) = framing, !requestIsHead { bodyOwed = n } else { bodyOwed = 0 }
        pendingHead.clear()
        writeResponseHead(into: pendingHead, status: status, reason: reason, version: requestVersion, framing: framing,
                          close: responseCloses, fields: fields)
        if framing == .none || framing == .length(0) || requestIsHead {
            stream.write(pendingHead.bytes)
            pendingHead.clear()
        }
    }

    /// A piece of the response body.
    public func sendBody(_ bytes: UnsafeRawBufferPointer) {
        guard !hasEnded, let framing = responseFraming, bytes.count > 0, !requestIsHead else { return }
        var bytes = bytes
        if case .length = framing {
            bytes = UnsafeRawBufferPointer(rebasing: bytes[0..<min(bytes.count, bodyOwed)])
            bodyOwed -= bytes.count
            if bytes.count == 0 { return }
        }
        writeBodyPiece(bytes, after: pendingHead.bytes, chunked: framing == .chunked, to: stream)
        pendingHead.clear()
    }

    public func sendBody(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { sendBody($0) }
    }

    // MARK: - Splicing (see `BodySplice`)

    /// Body bytes the current response still owes, if they may be spliced into the socket: a response of
    /// known length (not to HEAD) being sent on a plain TCP connection that is still open.
    var spliceableBodyOwed: Int? {
        guard !hasEnded, !stream.isClosed, !stream.usesTLS, case .length = responseFraming, !requestIsHead else { return nil }
        return bodyOwed
    }

    /// Writes a response head that waits for its first body piece: spliced bytes must follow it, and a
    /// body that has not started yet must not keep the head from the client.
    public func flushPendingHead() {
        guard !pendingHead.isEmpty else { return }
        stream.write(pendingHead.bytes)
        pendingHead.clear()
    }

    /// Takes back a started response whose head has not left yet (it waits for its first body piece), so
    /// that another answer can take its place; false once any byte of it went out.
    public func withdrawUnsentResponse() -> Bool {
        guard !hasEnded, responseFraming != nil, !pendingHead.isEmpty else { return false }
        pendingHead.clear()
        responseFraming = nil
        bodyOwed = 0
        return true
    }

    /// Spliced bytes the socket took count against the announced length, like bytes sent.
    func bodySpliced(_ n: Int) {
        bodyOwed -= min(max(n, 0), bodyOwed)
    }

    /// Ends the response; the connection then reads the next request or closes.
    public func finishResponse() {
        guard !hasEnded, let framing = responseFraming else { return }
        let last: StaticString = framing == .chunked && !requestIsHead ? "0\r\n\r\n" : ""
        last.withUTF8Buffer { stream.write(parts: pendingHead.bytes, UnsafeRawBufferPointer($0)) }
        pendingHead.clear()
        responseFraming = nil
        if bodyOwed > 0 {
            // Short of the announced length: only closing tells the client the body will not come.
            bodyOwed = 0
            readState = .ended
            stream.close()
            return
        }
        if responseCloses {
            readState = .ended
            stream.closeAfterFlush()
            return
        }
        if case .awaitingResponse = readState {
            readState = .head
            quietSince = monotonicSeconds()
            if !readingPausedByHandler { stream.resumeReading() }
            process()
            armActivityTimer()
        }
    }

    /// A complete response with a body.
    public func respond(_ response: HTTPResponseHead, body: [UInt8]) {
        startResponse(response, body: .known(body.count))
        sendBody(body)
        finishResponse()
    }

    /// A complete response with a body, its fields written by `fields` (see `HTTPFieldBlock`).
    public func respond(status: Int, reason: UnsafeRawBufferPointer, body: [UInt8], fields: (inout HTTPFieldBlock) -> Void) {
        startResponse(status: status, reason: reason, body: .known(body.count), fields: fields)
        sendBody(body)
        finishResponse()
    }

    /// Whether the current request asks to switch protocols (RFC 9110 section 7.8): HTTP/1.1, `Upgrade`
    /// listed in `Connection`, an `Upgrade` field, and no body. Only then can `switchProtocols` be used.
    public var requestAsksForUpgrade: Bool {
        guard !hasEnded, responseFraming == nil, case .awaitingResponse = readState, upgradeRequested else { return false }
        return true
    }

    /// Answers the current request with `101 Switching Protocols` (these fields, `Connection: Upgrade`
    /// added) and hands the socket over: the connection parses no more HTTP and reports nothing more to
    /// its handler until the tunnel closes the socket, which is reported as `ended(.closedLocally)`. It
    /// still counts against the server's connection limit until then. Bytes the client sent behind its
    /// request head travel with the endpoint. nil unless `requestAsksForUpgrade`.
    public func switchProtocols(_ response: HTTPResponseHead) -> TunnelEndpoint? {
        withBytes(of: response.reason) { reason in
            switchProtocols(reason: reason) { block in
                for field in response.fields { block.append(name: field.name, value: field.value) }
            }
        }
    }

    /// `switchProtocols` with the fields written by `fields` (see `HTTPFieldBlock`).
    public func switchProtocols(reason: UnsafeRawBufferPointer, fields: (inout HTTPFieldBlock) -> Void) -> TunnelEndpoint? {
        guard requestAsksForUpgrade else { return nil }
        let head = HeadBuffer()
        writeResponseHead(into: head, status: 101, reason: reason, version: .http11, framing: .none, close: false) { block in
            fields(&block)
            block.endField()
            block.buffer.append(literal: "Connection: Upgrade\r\n")
        }
        stream.write(head.bytes)
        return handOverSocket()
    }

    /// Stops parsing, reporting and timing here and gives the socket to a new owner (a tunnel, an HTTP/2
    /// connection); its close is reported as `ended(.closedLocally)` and releases the server's slot.
    private func handOverSocket() -> TunnelEndpoint {
        hasEnded = true
        readState = .ended
        disarmHeadTimer()
        if let activityTimer { event_del(activityTimer) }
        activityExpiry = .infinity
        return TunnelEndpoint(stream: stream) { [self] in
            handler?.connection(self, ended: .closedLocally)
            releaseFromServer()
        }
    }

    /// Hands the socket to an HTTP/2 connection after `connectionSentHTTP2Preface`: nothing more is parsed
    /// or reported here until the new owner closes the socket, which is reported as `ended(.closedLocally)`;
    /// it counts against the server's connection limit until then. The preface and what followed it stay
    /// in the stream's input. nil once a request head was parsed or the connection ended.
    public func takeOverForHTTP2() -> TunnelEndpoint? {
        guard !hasEnded, !sawRequestHead, case .head = readState else { return nil }
        return handOverSocket()
    }

    /// Closes at once, abandoning any unsent output (a stream that cannot be completed).
    public func close() {
        stream.close()
    }

    // MARK: - Receiving

    /// Parses what the buffer holds, as far as the state allows. Not re-entered: a handler that finishes a
    /// response from inside a callback makes the running loop continue with the next request.
    private func process() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        // The stream and its buffer are the connection's for life: one reference for the whole loop.
        let input = stream.input
        // Every state waits for bytes (or for the response): nothing to do without them. The scratch is
        // made here, with the first byte.
        guard input.count > 0 else { return }
        let scratch = self.scratch
        while !hasEnded && !readingPausedByHandler {
            switch readState {
            case .ended, .awaitingResponse:
                return
            case .head:
                guard input.count > 0 else { return }
                if detectsHTTP2Preface && !sawRequestHead {
                    switch HTTP2Preface.match(UnsafeRawBufferPointer(input.unconsumed)) {
                    case .partial:
                        // "PRI * HTTP/2.0\r\n\r\n" alone would parse as an HTTP/1.1 head: wait for the rest.
                        armHeadTimer()
                        return
                    case .complete:
                        detectsHTTP2Preface = false
                        disarmHeadTimer()
                        handler?.connectionSentHTTP2Preface(self)
                        continue
                    case .none:
                        detectsHTTP2Preface = false
                    }
                }
                do {
                    guard try scratch.parser.parseRequest(input.unconsumed, into: &scratch.head) else {
                        if HeadParser.requestCannotBeHTTP(UnsafeRawBufferPointer(input.unconsumed)) {
                            refuse(.invalidMethod)
                            return
                        }
                        if input.spaceAtEnd == 0 { input.compact() }
                        armHeadTimer()
                        return
                    }
                } catch {
                    refuse(error)
                    return
                }
                disarmHeadTimer()
                sawRequestHead = true
                refillHeadBytes(&scratch.headBytes, from: input, count: scratch.head.headLength)
                input.consume(scratch.head.headLength)
                requestVersion = scratch.head.semantics.version
                requestKeepAlive = scratch.head.semantics.keepAlive
                requestIsHead = scratch.head.method == .head
                requestExpectsContinue = scratch.head.expectsContinue && scratch.head.semantics.version == .http11
                continueSent = false
                bodyReceived = 0
                upgradeRequested = scratch.head.semantics.version == .http11 && scratch.head.semantics.connection.contains(.upgrade)
                    && scratch.head.semantics.framing == .none && scratch.head.fields.contains { field in
                        field.name.count == 7 && asciiEqualIgnoringCase(scratch.headBytes[field.name], Array("upgrade".utf8))
                    }
                // Only a connection over the limit asks the server (the common case costs no call).
                if isOverLimit, let server, !server.admitRequest(on: self) {
                    refuseOverLimit()
                    return
                }
                if maxBodyBytes > 0, case .length(let n) = scratch.head.semantics.framing, n > maxBodyBytes {
                    // At once, before any body byte: a client waiting for 100 Continue must not wait for
                    // a timeout to learn that the body will not be taken.
                    refuse(status: 413, reason: "Content Too Large", message: "request body larger than the limit", end: .bodyTooLarge)
                    return
                }
                switch scratch.head.semantics.framing {
                case .length(let n): readState = n == 0 ? .awaitingResponse : .lengthBody(remaining: n)
                case .chunked: readState = .chunkedBody; scratch.chunked = ChunkedDecoder(limits: limits)
                case .none, .untilClose: readState = .awaitingResponse
                }
                armActivityTimer()
                handler?.connection(self, receivedHead: ReceivedRequestHead(bytes: scratch.headBytes, parsed: scratch.head))
                if case .awaitingResponse = readState { handler?.connectionReceivedEnd(self) }
            case .lengthBody(let remaining):
                guard input.count > 0 else { return }
                let take = min(remaining, input.count)
                let piece = UnsafeRawBufferPointer(input.unconsumed)[0..<take]
                handler?.connection(self, receivedBody: UnsafeRawBufferPointer(rebasing: piece))
                input.consume(take)
                if take == remaining {
                    readState = .awaitingResponse
                    handler?.connectionReceivedEnd(self)
                } else {
                    readState = .lengthBody(remaining: remaining - take)
                }
            case .chunkedBody:
                guard input.count > 0 else { return }
                let used: Int
                var overCap = false
                do {
                    used = try scratch.chunked.decode(UnsafeRawBufferPointer(input.unconsumed)) { piece in
                        guard !overCap else { return }
                        if maxBodyBytes > 0 && piece.count > maxBodyBytes - bodyReceived {
                            overCap = true
                            return
                        }
                        bodyReceived += piece.count
                        handler?.connection(self, receivedBody: piece)
                    }
                } catch {
                    refuse(error)
                    return
                }
                if overCap {
                    refuse(status: 413, reason: "Content Too Large", message: "request body larger than the limit", end: .bodyTooLarge)
                    return
                }
                input.consume(used)
                if scratch.chunked.isComplete {
                    readState = .awaitingResponse
                    handler?.connectionReceivedEnd(self)
                }
            }
        }
    }

    /// Answers a protocol error and closes: after a framing error nothing that follows can be trusted.
    private func refuse(_ error: HTTPWireError) {
        let status = error.requestStatus
        let reason = status == 431 ? "Request Header Fields Too Large" : status == 505 ? "HTTP Version Not Supported"
            : status == 501 ? "Not Implemented" : "Bad Request"
        refuse(status: status, reason: reason, message: error.reason, end: .protocolError(error))
    }

    /// The server's connection limit leaves no slot for this request: the configured answer, then close.
    private func refuseOverLimit() {
        readState = .ended
        disarmHeadTimer()
        var bytes = serializeResponseHead(fixed.overLimitResponse, version: .http11, framing: .length(fixed.overLimitBody.count), close: true)
        bytes.append(contentsOf: fixed.overLimitBody)
        stream.write(bytes)
        end(.refusedOverLimit)   // before the lingering close, which may see the client's close at once
        stream.closeAfterFlush()
    }

    /// `lingering: false` closes at once (the connection limit needs the slot back before it returns) at the
    /// risk of a reset that loses the answer; otherwise the close lingers so the client can read it.
    private func refuse(status: Int, reason: String, message: String, end ending: ConnectionEnd, lingering: Bool = true) {
        readState = .ended
        disarmHeadTimer()
        if responseFraming == nil {
            let body = Array("\(message)\n".utf8)
            var bytes = serializeResponseHead(HTTPResponseHead(status: status, reason: reason, fields: [("Content-Type", "text/plain")]),
                                              version: .http11, framing: .length(body.count), close: true)
            bytes.append(contentsOf: body)
            stream.write(bytes)
        }
        // Reported before the lingering close starts: it reads at once, and a client that has already
        // closed would make that the end reported (closedLocally) instead of the reason.
        end(ending)
        if lingering { stream.closeAfterFlush() } else { stream.close() }
    }

    /// Reports the end to the handler. The server lets go of the connection only when its socket is
    /// closed, which after an error answer is later (lingering), not here.
    private func end(_ reason: ConnectionEnd) {
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
    private func releaseFromServer() {
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

extension HTTPServerConnection: SocketStreamOwner {
    func streamReceived(_ stream: SocketStream) {
        quietSince = monotonicSeconds()
        process()
        if !hasEnded, stream.input.spaceAtEnd == 0, stream.input.count == stream.input.capacity {
            // Full of bytes nobody may consume yet (a pipeline behind a slow response): stop reading until
            // the response is done; process() resumes.
            stream.pauseReading()
        }
    }

    func streamReachedEnd(_ stream: SocketStream) {
        // A client may half-close after a complete request and still read the answer: stop reading (the
        // end would be reported again and again) and finish the response; the next read after it sees the
        // end again. Anywhere else the end of input ends the connection.
        if case .awaitingResponse = readState, !(halfCloseEndsTheConnection && responseFraming != nil) {
            peerHalfClosed = true
            stream.pauseReading()
            return
        }
        end(.peerClosed)
        stream.close()
    }

    func streamFailed(_ stream: SocketStream, errno: Int32) {
        end(.failed(errno: errno))
    }

    func streamDrained(_ stream: SocketStream) {
        handler?.connectionCanSendMore(self)
    }

    func streamClosed(_ stream: SocketStream) {
        if hasEnded {
            releaseFromServer()
        } else {
            end(.closedLocally)
        }
    }
}

let activityTimerTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let connection = Unmanaged<HTTPServerConnection>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.activityTimerFired() }
}

let headTimerTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    let connection = Unmanaged<HTTPServerConnection>.fromOpaque(context).takeUnretainedValue()
    withExtendedLifetime(connection) { connection.headTimerFired() }
}

/// A piece of a message body, for both sides: after the head if it has not gone yet (one write instead of
/// two), as one chunk when the body is chunked.
func writeBodyPiece(_ bytes: UnsafeRawBufferPointer, after headBytes: UnsafeRawBufferPointer, chunked: Bool, to stream: SocketStream) {
    if chunked {
        writeChunk(bytes, after: headBytes, to: stream)
    } else {
        stream.write(parts: headBytes, bytes)
    }
}

/// One chunk of a chunked body (size line, data, CRLF) in one writev, after `prefix` (a head not yet sent).
func writeChunk(_ bytes: UnsafeRawBufferPointer, after prefix: UnsafeRawBufferPointer, to stream: SocketStream) {
    var line: (UInt64, UInt64, UInt64) = (0, 0, 0)   // up to 16 hex digits + CRLF, no allocation
    withUnsafeMutableBytes(of: &line) { buffer in
        var digits = 0
        var n = bytes.count
        repeat { digits += 1; n >>= 4 } while n > 0
        n = bytes.count
        for i in stride(from: digits - 1, through: 0, by: -1) {
            let d = UInt8(n & 15)
            buffer[i] = d < 10 ? 0x30 + d : 0x61 + d - 10
            n >>= 4
        }
        buffer[digits] = 0x0D
        buffer[digits + 1] = 0x0A
        let crlf: (UInt8, UInt8) = (0x0D, 0x0A)
        withUnsafeBytes(of: crlf) { crlfBytes in
            stream.write(parts: prefix, UnsafeRawBufferPointer(rebasing: buffer[0..<(digits + 2)]), bytes, crlfBytes)
        }
    }
}
