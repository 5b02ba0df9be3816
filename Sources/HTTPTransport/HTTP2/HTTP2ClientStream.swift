import CNghttp2
import HTTPWire

/// What an HTTP/2 upstream stream reports, in order, on the loop's thread: the response head, body
/// pieces, trailers, the end; or `ended` when the stream failed first (after which nothing more comes).
public protocol HTTP2ClientStreamHandler: AnyObject {
    func stream(_ stream: HTTP2ClientStream, receivedHead head: ReceivedResponseHead)
    /// The response head arrived and is kept back (`deferHeadUntilBody`): `receivedHead` follows with the
    /// first DATA or the trailers. What waits for a head can stop waiting; nothing is known of it yet.
    func streamWithheldHead(_ stream: HTTP2ClientStream)
    /// Valid only during the call.
    func stream(_ stream: HTTP2ClientStream, receivedBody bytes: UnsafeRawBufferPointer)
    /// The response's trailer fields, before `streamReceivedEnd`. `beforeAnyData`: no DATA byte came
    /// before them; `trailersOnly`: the response was one HEADERS frame with END_STREAM and these are its
    /// fields (reported before the head then, so that whoever decides on the head has them).
    func stream(_ stream: HTTP2ClientStream, receivedTrailers fields: [(name: String, value: String)], beforeAnyData: Bool, trailersOnly: Bool)
    func streamReceivedEnd(_ stream: HTTP2ClientStream)
    func streamCanSendMore(_ stream: HTTP2ClientStream)
    func stream(_ stream: HTTP2ClientStream, failed: HTTP2ClientStream.Failure)
}

/// One request on an `HTTP2ClientConnection`, with the calls of an HTTP/1.1 client connection's single
/// request. The response head is handed over as a `ReceivedResponseHead` (HTTP/1.1 field lines made
/// from the HTTP/2 fields and parsed by HTTPWire), so the layers above read both alike: a body without
/// `content-length` reads as chunked, a response that ended with its HEADERS as `content-length: 0`.
public final class HTTP2ClientStream {
    public enum Failure: Sendable, CustomStringConvertible {
        /// The server did not process the request (REFUSED_STREAM, or above a GOAWAY's last-stream-id, or
        /// never sent): it may go again on another connection, whatever its method.
        case notProcessed(String)
        /// The stream was reset or its connection lost after the server may have acted on it.
        case lost(String, responseStarted: Bool)
        /// The response broke HTTP semantics (the parser's reason).
        case invalidResponse(String)
        /// The connection never came up (the reason in words): nothing of the request left.
        case connectFailed(String)
        /// Nothing came for the stream within its silence limit (`setSilenceLimit`).
        case timedOut(responseStarted: Bool)

        public var description: String {
            switch self {
            case .notProcessed(let why): return "not processed by the upstream (\(why))"
            case .lost(let why, _): return why
            case .invalidResponse(let why): return "invalid HTTP/2 response: \(why)"
            case .timedOut: return "timed out"
            case .connectFailed(let why): return "could not connect (\(why))"
            }
        }
    }

    public internal(set) var id: Int32 = -1
    public let connection: HTTP2ClientConnection
    /// Held strongly until the stream ends.
    public var handler: HTTP2ClientStreamHandler?
    /// Holds the response head back until the first DATA byte or the trailers (a gRPC call: whether the
    /// answer has a message decides whether its status can still be acted on).
    public var deferHeadUntilBody = false
    public private(set) var responseStarted = false

    private var requestMethod = HTTPMethod.get
    /// The current header block (`settings.maxHeadBytes` bounds it), mapped onto HTTP/1.1 by HTTPWire.
    private var block: HTTP2ResponseFields
    /// The final response's status once its head came (a 1xx head's while one is read).
    private var status = 0
    private var headDone = false
    /// Why nghttp2 refused a frame of this stream (and reset it on our side), if it did.
    private var rejection: String?
    private var heldHead: ReceivedResponseHead?
    private var dataSeen = false
    /// END_STREAM came from the server: the response is complete.
    private var endSeen = false
    private var paused = false
    private var owed = 0
    private var outbound = HTTP2OutboundBytes()
    private var finishing = false
    private var requestTrailers: [(name: String, value: String)] = []
    private var deferred = false
    /// The request's last frame (END_STREAM) is handed to nghttp2.
    private var requestSent = false
    var wantsCanSendMore = false
    /// Where the request stands with `Expect: 100-continue` (`startRequest(..., continueWait:)`): while
    /// `.waiting` the body is held, so a final answer that comes first (a 401) finds none of it sent.
    public private(set) var continueState = HTTPClientConnection.ContinueState.notExpected
    private var continueTimer: TransportTimer?
    private var released = false
    public private(set) var isEnded = false

    init(connection: HTTP2ClientConnection) {
        self.connection = connection
        block = HTTP2ResponseFields(maxBytes: connection.settings.maxHeadBytes)
    }

    // MARK: - The request

    /// Sends the request head: `:method`, `:scheme`, `:authority` and `:path`, then the field lines
    /// `fields` writes (lower-cased, connection-specific ones left out; a `Host` line becomes `:authority`).
    /// `continueWait` (with a body): `expect: 100-continue` is sent and the body held (`canSendMore` false)
    /// until the server's 100, or for that many seconds, as `HTTPClientConnection` does.
    public func startRequest(method: HTTPMethod, methodName: String, target: [UInt8], hasBody: Bool,
                             continueWait: Double? = nil, fields: (inout HTTPFieldBlock) -> Void) {
        requestMethod = method
        if !connection.isReady, let reason = connection.connectFailure { return fail(.connectFailed(reason)) }
        var block = HTTPFieldBlock()
        fields(&block)
        var list = HTTP2FieldList()
        list.append(name: ":method", value: methodName)
        list.append(name: ":scheme", value: connection.scheme)
        var authority = connection.host
        var rest = HTTP2FieldList()
        rest.appendLines(block.buffer.bytes, authority: &authority)
        list.append(name: ":authority", value: authority)
        var pathName = ":path"
        pathName.withUTF8 { name in target.withUnsafeBytes { list.append(name: UnsafeRawBufferPointer(name), value: $0) } }
        list.append(contentsOf: rest)
        if hasBody, let continueWait {
            list.append(name: "expect", value: "100-continue")
            continueState = .waiting
            continueTimer = TransportTimer(loop: connection.loop) { [unowned self] in self.continueWaitEnded(.waitExpired) }
            continueTimer?.schedule(after: continueWait)
        }
        if !connection.submit(self, fields: list, hasBody: hasBody) {
            return fail(.notProcessed("the connection takes no new stream"))
        }
        if !hasBody { requestSent = true }
    }

    public func sendBody(_ bytes: UnsafeRawBufferPointer) {
        guard !isEnded, !finishing, bytes.count > 0 else { return }
        outbound.append(bytes)
        resume()
    }

    public func sendBody(_ bytes: [UInt8]) { bytes.withUnsafeBytes { sendBody($0) } }

    /// Ends the request body; `trailers` go in a HEADERS frame after it.
    public func finishRequest(trailers: [(name: String, value: String)] = []) {
        guard !isEnded, !finishing else { return }
        requestTrailers = trailers
        finishing = true
        resume()
    }

    public var canSendMore: Bool {
        let ok = continueState != .waiting && outbound.count < connection.settings.streamBufferLimit && connection.socketHasRoom
        if !ok { wantsCanSendMore = true }
        return ok
    }

    /// Longest the upstream may leave this stream without a frame while its response is read (nil: for
    /// ever, as an event stream may need). Checked by the connection's timer (`HTTP2ClientConnection`), so a
    /// stream costs no timer of its own.
    public func setSilenceLimit(_ seconds: Double?) {
        silenceLimit = seconds.flatMap { $0 > 0 && $0.isFinite ? $0 : nil }
        lastInput = monotonicSeconds()
        if let limit = silenceLimit { connection.watchSilence(limit) }
    }

    private(set) var silenceLimit: Double?
    private(set) var lastInput = 0.0

    /// The connection's timer found the stream silent past its limit: it ends as timed out, and is reset.
    func silenceExpired() {
        failAndReset(.timedOut(responseStarted: responseStarted), code: NGHTTP2_CANCEL.rawValue)
    }

    /// Stops handing the response window back to the server (the client is slow); `resumeReading` does.
    /// While paused the silence limit does not run: once its window is used up the server is silent
    /// because we hold it, and a slow client must not get its long response cut for that.
    public func pauseReading() { paused = true }

    /// Whether the silence limit is suspended (`pauseReading`).
    var isReadingPaused: Bool { paused }

    public func resumeReading() {
        guard paused else { return }
        paused = false
        // Silence counts from now: the window handed back below is what lets the server speak again.
        if let limit = silenceLimit {
            lastInput = monotonicSeconds()
            connection.watchSilence(limit)
        }
        if owed > 0 {
            connection.consume(id, owed)
            owed = 0
        }
    }

    /// Lets go of the stream: nothing more is reported. One still open (the response not complete, or
    /// complete while the request body is unfinished) is reset with CANCEL, so that it does not hold a
    /// place of the connection's stream limit.
    public func cancel() {
        handler = nil
        isEnded = true
        continueTimer?.cancel()
        // Both ends done: nghttp2 closes the stream by itself (a reset would only be one more frame).
        guard !released, !(endSeen && requestSent) else { return }
        if id > 0 {
            connection.submitControl { session in
                _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, UInt32(NGHTTP2_CANCEL.rawValue))
            }
        } else {
            release()
        }
    }

    private func resume() {
        guard deferred, id > 0 else { return connection.scheduleFlush() }
        deferred = false
        connection.submitControl { session in _ = nghttp2_session_resume_data(session, id) }
    }

    func readBody(into buffer: UnsafeMutablePointer<UInt8>, _ length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        let n = outbound.take(into: buffer, length)
        if outbound.isEmpty && finishing {
            flags.pointee |= UInt32(NGHTTP2_DATA_FLAG_EOF.rawValue)
            requestSent = true
            if !requestTrailers.isEmpty, let session = connection.sessionForStreams {
                flags.pointee |= UInt32(NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue)
                var list = HTTP2FieldList()
                for field in requestTrailers { list.append(name: field.name, value: field.value) }
                list.withNameValues { nva, count in _ = nghttp2_submit_trailer(session, id, nva, count) }
            }
            return n
        }
        if n == 0 {
            deferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
        if wantsCanSendMore { connection.scheduleFlush() }
        return n
    }

    // MARK: - The response (from nghttp2's callbacks)

    func beginHeaders() {
        lastInput = monotonicSeconds()
        block.begin()
    }

    /// False when the header block grows over `settings.maxHeadBytes` (the stream is then reset).
    func addField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        guard block.add(name: name, value: value) else {
            rejectedByUs("response header list over \(connection.settings.maxHeadBytes) bytes")
            return false
        }
        return true
    }

    /// The server's 100, or the end of the wait for it: the body may go (`streamCanSendMore` follows from the
    /// connection's flush, outside nghttp2's callbacks).
    private func continueWaitEnded(_ outcome: HTTPClientConnection.ContinueState) {
        guard continueState == .waiting, !isEnded else { return }
        continueState = outcome
        continueTimer?.cancel()
        wantsCanSendMore = true
        connection.scheduleFlush()
    }

    func headersComplete(endStream: Bool) {
        guard !isEnded else { return }
        if !headDone { status = block.status }
        if !headDone && status == 100 { continueWaitEnded(.received) }
        if !headDone && status >= 200 && continueState == .waiting {
            // A final answer before the body was asked for: none of it is sent (the stream is reset when let go).
            continueState = .finalResponseFirst
            continueTimer?.cancel()
        }
        if endStream && (headDone || status >= 200) { endSeen = true }
        if headDone {
            // Trailers (nghttp2 has checked that they carry END_STREAM and no pseudo-header).
            report(trailers: stringFields(), trailersOnly: false)
            return responseComplete()
        }
        if status >= 100 && status < 200 { return }   // an interim response: the final one follows
        headDone = true
        responseStarted = true
        guard let head = makeHead(endStream: endStream) else { return }
        if endStream {
            handler?.stream(self, receivedTrailers: stringFields(), beforeAnyData: true, trailersOnly: true)
            handler?.stream(self, receivedHead: head)
            return responseComplete()
        }
        if deferHeadUntilBody {
            heldHead = head
            handler?.streamWithheldHead(self)
        } else {
            handler?.stream(self, receivedHead: head)
        }
    }

    private func report(trailers: [(name: String, value: String)], trailersOnly: Bool) {
        handler?.stream(self, receivedTrailers: trailers, beforeAnyData: !dataSeen, trailersOnly: trailersOnly)
        releaseHeldHead()
    }

    private func releaseHeldHead() {
        guard let head = heldHead else { return }
        heldHead = nil
        handler?.stream(self, receivedHead: head)
    }

    func receivedBody(_ bytes: UnsafeRawBufferPointer) {
        guard handler != nil, !isEnded else { return connection.consume(id, bytes.count) }
        if silenceLimit != nil { lastInput = monotonicSeconds() }
        if !bytes.isEmpty { dataSeen = true }
        releaseHeldHead()
        handler?.stream(self, receivedBody: bytes)
        if paused { owed += bytes.count } else { connection.consume(id, bytes.count) }
    }

    func receivedEnd() {
        endSeen = true
        releaseHeldHead()
        responseComplete()
    }

    /// END_STREAM from the server: the response is complete, whether or not our request body is (a server
    /// may answer early; `cancel` then resets the stream).
    private func responseComplete() {
        guard headDone, !isEnded else { return }
        isEnded = true
        let told = handler
        handler = nil
        told?.streamReceivedEnd(self)
    }

    /// The stream is closed: complete when the response ended, otherwise a failure.
    func closed(errorCode: UInt32, notProcessed: Bool, connectionLost: Bool = false) {
        if owed > 0 {
            _ = connection.sessionForStreams.map { nghttp2_session_consume_connection($0, owed) }
            owed = 0
        }
        guard !isEnded else { return release() }
        if endSeen && headDone {
            responseComplete()
            return release()
        }
        if notProcessed && !responseStarted {
            fail(.notProcessed(errorCode == NGHTTP2_REFUSED_STREAM.rawValue ? "REFUSED_STREAM" : "GOAWAY"))
        } else if connectionLost {
            fail(.lost(responseStarted ? "connection lost mid-response" : "connection closed before a response", responseStarted: responseStarted))
        } else if let rejection {
            fail(.lost("invalid HTTP/2 response (\(rejection)), stream reset by tokenrelay", responseStarted: responseStarted))
        } else {
            fail(.lost("stream reset by the upstream (HTTP/2 error \(errorCode))", responseStarted: responseStarted))
        }
    }

    func rejectedByUs(_ reason: String) {
        if rejection == nil { rejection = reason }
    }

    private func fail(_ failure: Failure) {
        guard !isEnded else { return }
        isEnded = true
        continueTimer?.cancel()
        let told = handler
        handler = nil
        told?.stream(self, failed: failure)
        release()
    }

    private func release() {
        guard !released else { return }
        released = true
        connection.streamReleased()
    }

    private func stringFields() -> [(name: String, value: String)] { block.stringFields }

    /// The head as HTTP/1.1 bytes, parsed by HTTPWire like any upstream's.
    private func makeHead(endStream: Bool) -> ReceivedResponseHead? {
        var bytes = block.http1Head(requestMethod: requestMethod, endStream: endStream, reason: HTTPStatusPhrase.phrase(for: status))
        var parser = HeadParser(limits: block.headLimits(HTTPWireLimits(maxHeadBytes: connection.settings.maxHeadBytes), headBytes: bytes.count))
        var parsed = ResponseHead()
        let method = requestMethod
        let outcome: Result<Bool, HTTPWireError> = bytes.withUnsafeMutableBytes { buffer in
            do throws(HTTPWireError) { return .success(try parser.parseResponse(buffer, requestMethod: method, into: &parsed)) } catch { return .failure(error) }
        }
        switch outcome {
        case .success(true):
            return ReceivedResponseHead(bytes: bytes, parsed: parsed)
        case .success(false):
            failAndReset(.invalidResponse("incomplete head"))
        case .failure(let error):
            failAndReset(.invalidResponse(error.reason))
        }
        return nil
    }

    private func failAndReset(_ failure: Failure, code: UInt32 = NGHTTP2_PROTOCOL_ERROR.rawValue) {
        let id = self.id
        fail(failure)
        connection.submitControl { session in
            _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, code)
        }
    }
}
