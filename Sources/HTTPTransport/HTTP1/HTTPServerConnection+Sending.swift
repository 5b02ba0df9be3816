import CLibevent
import HTTPWire
import Glibc

/// The response side: the head (held back to go out with the first body piece), the body in its framing,
/// the finish that lets the next request be parsed, splicing, and handing the socket over (101 Switching
/// Protocols, HTTP/2). Apart from `HTTPServerConnection.swift` (state, reading control, the end) and
/// `+Receiving` (the parser) so that each direction reads alone.
extension HTTPServerConnection {
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
}
