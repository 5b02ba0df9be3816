import CLibevent
import HTTPWire
import Glibc

/// The request side: parsing what the socket delivered (preface, head, length or chunked body) one request
/// at a time, the error answers the transport gives itself, and the socket's reports. Apart from
/// `HTTPServerConnection.swift` (state, reading control, the end) and `+Sending` so that each direction
/// reads alone.
extension HTTPServerConnection {
    /// Parses what the buffer holds, as far as the state allows. Not re-entered: a handler that finishes a
    /// response from inside a callback makes the running loop continue with the next request.
    func process() {
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
    func refuse(_ error: HTTPWireError) {
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
    func refuse(status: Int, reason: String, message: String, end ending: ConnectionEnd, lingering: Bool = true) {
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
