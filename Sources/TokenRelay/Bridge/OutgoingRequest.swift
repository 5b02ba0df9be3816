import CLibevent

/// Why an outgoing request did not complete.
struct OutgoingFailure: Error, CustomStringConvertible {
    enum Kind: String {
        case connect, connectTimeout = "connect_timeout", timeout, connectionLost = "connection_lost", invalidResponse = "invalid_response", tooLarge = "too_large", tls
    }
    let kind: Kind
    /// True once any response byte arrived; before that, a failure may still be retried safely in some cases.
    let afterResponseStarted: Bool
    /// The TLS cause, when the connection's TLS state has one (then `kind` is `.tls`).
    var tls: TLSFailure? = nil
    /// What was wrong with an invalid response, when tokenrelay itself refused it.
    var detail: String? = nil

    /// Whether the peer may have received and acted on the request (the refresh path logs this as
    /// "outcome unknown": a rotated refresh token may be lost in flight). A certificate we refused means
    /// the handshake never finished, so nothing was sent.
    var mayHaveReachedPeer: Bool { kind != .connect && kind != .connectTimeout && !(tls?.certificateRejected ?? false) }

    var description: String {
        switch kind {
        case .connect: return "could not connect"
        case .connectTimeout: return "could not connect in time"
        case .timeout: return "timed out"
        case .connectionLost: return afterResponseStarted ? "connection lost mid-response" : "connection closed before a response"
        case .invalidResponse: return "invalid HTTP response" + (detail.map { ": \($0)" } ?? "")
        case .tooLarge: return "response too large"
        case .tls: return "TLS failure: \(tls?.reason ?? "unknown")"
        }
    }
}

protocol OutgoingRequestDelegate: AnyObject {
    /// Status line and headers are in (`evhttp_request_get_response_code`, `_get_input_headers`).
    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer)
    /// More body bytes sit in `evhttp_request_get_input_buffer(response)`; take them or they accumulate.
    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer)
    /// Exactly once per started request, unless it was cancelled.
    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>)
}

/// One request on an `evhttp_connection`, turning libevent's irregular callbacks into exactly one
/// `outgoingRequestFinished` (or none after `cancel()`).
///
/// It retains itself from `start` until evhttp is done with the request, because evhttp owns the
/// `evhttp_request` and may call back after every Swift reference to this object is gone.
final class OutgoingRequest {
    weak var delegate: OutgoingRequestDelegate?
    private var request: OpaquePointer?
    /// Kept to read the TLS cause of a failure (evhttp has detached the request from it by then: docs/evhttp.md, detached-request).
    private var connection: OpaquePointer?
    private var reportedError: evhttp_request_error?
    private(set) var headersReceived = false
    /// Set when the response's framing headers were ambiguous and the response was refused.
    private var framingProblem: String?
    private var selfRetain: Unmanaged<OutgoingRequest>?

    init(delegate: OutgoingRequestDelegate) {
        self.delegate = delegate
    }

    /// Creates the request, lets `prepare` fill its headers and body, and sends it.
    /// Returns false when evhttp refused to start it (no callback will follow).
    func start(on connection: OpaquePointer, method: evhttp_cmd_type, target: String, prepare: (OpaquePointer) -> Void) -> Bool {
        let retained = Unmanaged.passRetained(self)
        let context = retained.toOpaque()
        guard let req = evhttp_request_new(outgoingDoneTrampoline, context) else {
            retained.release()
            return false
        }
        evhttp_request_set_header_cb(req, outgoingHeaderTrampoline)
        evhttp_request_set_chunked_cb(req, outgoingChunkTrampoline)
        evhttp_request_set_error_cb(req, outgoingErrorTrampoline)
        prepare(req)
        selfRetain = retained
        request = req
        self.connection = connection
        if evhttp_make_request(connection, req, method, target) != 0 {
            // evhttp's contract on this path is unclear (it may or may not free req); never touch it again.
            request = nil
            self.connection = nil
            selfRetain = nil
            retained.release()
            return false
        }
        return true
    }

    /// Stops the request; evhttp resets the connection, which stays usable for the next request.
    func cancel() {
        guard let req = request else { return }
        request = nil
        connection = nil
        evhttp_cancel_request(req)  // calls `failed(CANCEL)` re-entrantly, which is ignored now
        releaseSelf()
    }

    /// Returns false to make evhttp fail the request: a response whose framing is ambiguous (two
    /// different lengths, a length with chunked) is never relayed, and its connection is never reused.
    func receivedHeaders(_ response: OpaquePointer) -> Bool {
        guard request != nil else { return true }
        headersReceived = true
        let status = evhttp_request_get_response_code(response)
        // evhttp treats an interim 1xx other than 100 (103 Early Hints, an unasked-for 101) as the final
        // response and leaves the real one unread: relayed, the client would wait for a final response
        // that never comes. A status that is not three digits is no HTTP status at all.
        if status != 100 && !(200...599).contains(status) {
            framingProblem = status < 200 ? "an interim \(status) response, which tokenrelay does not relay" : "invalid status code \(status)"
            return false
        }
        if let problem = MessageFraming.problem(HeaderList(raw: evhttp_request_get_input_headers(response)).entries,
                                                equalDuplicateLengths: true) {
            framingProblem = problem
            return false
        }
        delegate?.outgoingRequestReceivedHeaders(self, response: response)
        return true
    }

    func receivedBody(_ response: OpaquePointer) {
        guard request != nil else { return }
        delegate?.outgoingRequestReceivedBody(self, response: response)
    }

    func failed(_ error: evhttp_request_error) {
        guard request != nil else { return }
        reportedError = error
    }

    func completed(_ response: OpaquePointer?) {
        guard request != nil else { return }
        request = nil
        defer { releaseSelf() }
        let connection = self.connection
        self.connection = nil
        if let response, reportedError == nil, evhttp_request_get_response_code(response) != 0 {
            delegate?.outgoingRequestFinished(self, result: .success(response))
            return
        }
        var failure = failure(connectFailed: response != nil)
        if let connection, let tls = TLSDiagnostics.failure(on: connection) {
            failure = OutgoingFailure(kind: .tls, afterResponseStarted: failure.afterResponseStarted, tls: tls)
        }
        delegate?.outgoingRequestFinished(self, result: .failure(failure))
    }

    private func failure(connectFailed: Bool) -> OutgoingFailure {
        // A done callback with a request but status 0 is evhttp's "could not connect" path.
        if let framingProblem { return OutgoingFailure(kind: .invalidResponse, afterResponseStarted: true, detail: framingProblem) }
        if connectFailed && reportedError == nil { return OutgoingFailure(kind: .connect, afterResponseStarted: false) }
        let kind: OutgoingFailure.Kind
        switch reportedError {
        case EVREQ_HTTP_TIMEOUT: kind = .timeout
        case EVREQ_HTTP_INVALID_HEADER: kind = .invalidResponse
        case EVREQ_HTTP_DATA_TOO_LONG: kind = .tooLarge
        default: kind = .connectionLost
        }
        return OutgoingFailure(kind: kind, afterResponseStarted: headersReceived)
    }

    private func releaseSelf() {
        let retained = selfRetain
        selfRetain = nil
        retained?.release()
    }
}
