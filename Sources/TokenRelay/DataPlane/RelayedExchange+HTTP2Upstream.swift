import HTTPTransport
import HTTPWire

/// An exchange's stream to an HTTP/2 upstream, and what its response brought besides head and body.
final class HTTP2UpstreamLink {
    var stream: HTTP2ClientStream?
    var ticket: HTTP2UpstreamPool.Ticket?
    /// Set before the head is reported to the machine when the response's trailers came before any DATA
    /// (the gRPC refresh decision reads it there, see `RelayedExchange.trailersBeforeData`).
    var trailersBeforeData: UpstreamTrailers?
    /// Trailers that came after the body: relayed to an HTTP/2 client at the response's end.
    var trailers: [(name: String, value: String)] = []
    /// The head's latency was recorded when it arrived withheld (`streamWithheldHead`): the wait for the
    /// first message after it is not the upstream's head latency.
    var headLatencyRecorded = false
    /// The request is a gRPC call (`HTTP2ClientSession.isGRPC`).
    var isGRPC = false

    func cancelWait() {
        ticket?.cancel()
        ticket = nil
    }
}

/// The HTTP/2 upstream path of `RelayedExchange`: a stream from the route's `HTTP2UpstreamPool` instead
/// of a connection from its HTTP/1.1 pool. The machine, the header rules and the refresh decision are
/// the same; what differs is how a request goes out (HEADERS and DATA on a stream) and how a failure
/// reads (a stream the server did not process, after GOAWAY or REFUSED_STREAM, goes again on another
/// connection whatever its method: the server said it did not act on it).
extension RelayedExchange: HTTP2ClientStreamHandler {
    /// Trailers of the current response that came before any DATA (Trailers-Only, or HEADERS + trailers):
    /// set before the head reaches `upstreamReceivedHead`; nil on the HTTP/1.1 path.
    var trailersBeforeData: UpstreamTrailers? { http2?.trailersBeforeData }

    func acquireStream(_ pool: HTTP2UpstreamPool, lane: HTTPTransport.UpstreamPool.Lane) {
        let link = http2 ?? HTTP2UpstreamLink()
        http2 = link
        let ticket = pool.acquire(lane: lane) { [weak self] result in
            guard let self, !self.finished else {
                if case .success(let stream) = result { stream.cancel() }
                return
            }
            self.http2?.ticket = nil
            let now = EventLoop.monotonicNow
            switch result {
            case .success(let stream): self.streamGranted(stream)
            case .failure(.tooManyWaiters): self.step { $0.connectionRefused(now: now) }
            case .failure where pool.serverChoseHTTP1:
                // "alpn": the server selected HTTP/1.1. The request goes to the HTTP/1.1 pool, unless it is a
                // gRPC call, which cannot be carried there.
                self.http2 = nil
                guard !HTTP2ClientSession.isGRPC(self.head) else {
                    let failure = RequestLifecycle.UpstreamFailure(kind: .invalidResponse, responseStarted: false,
                                                                   description: "gRPC needs HTTP/2; the upstream selected HTTP/1.1 in ALPN")
                    return self.step { $0.upstreamFailed(failure, now: now) }
                }
                self.acquireConnection(lane: lane, fresh: false)
            case .failure(let failure):
                let failure = RequestLifecycle.UpstreamFailure(kind: .connect, responseStarted: false, description: failure.description)
                self.step { $0.upstreamFailed(failure, now: now) }
            }
        }
        if ticket.isWaiting {
            link.ticket = ticket
            step { $0.connectionQueued() }
        }
    }

    /// The token is read now, as for a connection: a refresh may have finished while we waited.
    private func streamGranted(_ stream: HTTP2ClientStream) {
        http2?.stream = stream
        let admission = lifecycle.passthrough ? nil : admissionAtArrival.take() ?? context.coordinator.admit()
        if case .send(_, let authorization) = admission { grantedAuthorization = authorization }
        let reused = stream.connection.streamsStarted > 0, now = EventLoop.monotonicNow
        step { $0.connectionAcquired(reused: reused, admission: admission, now: now) }
    }

    func sendOnStream(_ credential: RequestLifecycle.Credential) {
        guard let link = http2, let stream = link.stream else { return }
        sentAt = EventLoop.monotonicNow
        captured = nil
        link.trailersBeforeData = nil
        link.trailers = []
        link.headLatencyRecorded = false
        stream.handler = self
        let grpc = HTTP2ClientSession.isGRPC(head)
        link.isGRPC = grpc
        // A gRPC answer's head waits for its first message or its trailers while a refusal could still be
        // replayed: whether a message came decides whether its status can still be acted on (see
        // `trailersBeforeData`). A replay's or a streamed call's head goes at once (its status is the client's).
        stream.deferHeadUntilBody = grpc && lifecycle.withholdsGRPCResponseHead
        switch body {
        case .kept(let bytes):
            // An h2 client's request trailers go on (a gRPC client may send some); the request then has a
            // body section even when it is empty.
            let trailers = client.requestTrailers
            stream.startRequest(method: head.method, methodName: upstreamMethod, target: upstreamTarget,
                                hasBody: !bytes.isEmpty || !trailers.isEmpty) {
                writeForwardedFields(into: &$0, credential)
                // HTTP/1.1's hop-by-hop `te` was dropped with the other hop-by-hop fields; gRPC servers want it.
                if grpc { $0.append(name: "te", value: "trailers") }
            }
            if !bytes.isEmpty || !trailers.isEmpty {
                stream.sendBody(bytes)
                stream.finishRequest(trailers: trailers)
            }
        case .streamed(let streamed):
            // As on HTTP/1.1: a client that left while its request waited gets no head sent for a body that
            // will never come.
            if client.endIfPeerLeftWhilePaused() { return }
            // As on HTTP/1.1, `expect: 100-continue`: a 401 then comes before the body leaves and the request
            // can still be replayed. Not for gRPC: its servers do not answer 100, and a streamed call's
            // status is the client's anyway.
            stream.startRequest(method: head.method, methodName: upstreamMethod, target: upstreamTarget, hasBody: true,
                                continueWait: grpc ? nil : context.timeouts.continueSeconds) {
                writeForwardedFields(into: &$0, credential)
                if grpc { $0.append(name: "te", value: "trailers") }
            }
            streamed.attach(stream)
        }
    }

    /// The stream is no longer this request's: one still open (the response not read to its end, or the
    /// client gone) is reset, so that the server stops working for nobody.
    func releaseStream() {
        guard let link = http2, let stream = link.stream else { return }
        link.stream = nil
        streamed?.detach()
        stream.handler = nil
        upstreamReadingPaused = false
        stream.cancel()
    }

    func resumeStreamReading() {
        guard upstreamReadingPaused, let stream = http2?.stream else { return }
        upstreamReadingPaused = false
        stream.resumeReading()
    }

    // MARK: - The stream's reports

    func stream(_ stream: HTTP2ClientStream, receivedHead head: ReceivedResponseHead) {
        guard stream === http2?.stream else { return }
        upstreamReceivedHead(head, bodyBytesSent: 0)
    }

    func streamWithheldHead(_ stream: HTTP2ClientStream) {
        guard let link = http2, stream === link.stream else { return }
        context.metrics.upstreamLatency.record(EventLoop.monotonicNow - sentAt)
        link.headLatencyRecorded = true
        step { $0.responseHeadWithheld() }
    }

    func stream(_ stream: HTTP2ClientStream, receivedBody bytes: UnsafeRawBufferPointer) {
        guard stream === http2?.stream else { return }
        upstreamReceivedBody(bytes)
    }

    func stream(_ stream: HTTP2ClientStream, receivedTrailers fields: [(name: String, value: String)], beforeAnyData: Bool, trailersOnly: Bool) {
        guard let link = http2, stream === link.stream else { return }
        if beforeAnyData { link.trailersBeforeData = UpstreamTrailers(fields: fields, beforeAnyData: true, trailersOnly: trailersOnly) }
        // A Trailers-Only response's fields are its head's, relayed with it.
        if !trailersOnly { link.trailers = fields }
    }

    func streamReceivedEnd(_ stream: HTTP2ClientStream) {
        // The stream stays the exchange's until the machine releases it (`releaseStream`): one whose
        // request body is still unfinished is reset there.
        guard stream === http2?.stream else { return }
        let now = EventLoop.monotonicNow
        step { $0.responseEnded(now: now) }
    }

    func streamCanSendMore(_ stream: HTTP2ClientStream) {
        guard stream === http2?.stream, !finished else { return }
        streamed?.upstreamCanTakeMore(stream)
    }

    func stream(_ stream: HTTP2ClientStream, failed: HTTP2ClientStream.Failure) {
        guard let link = http2, stream === link.stream else { return }
        link.stream = nil
        streamed?.detach()
        let failure: RequestLifecycle.UpstreamFailure
        switch failed {
        case .notProcessed:
            // The server said it did not act on it: as safe to send again as a connection never made.
            failure = .init(kind: .connect, responseStarted: false, description: failed.description)
        case .lost(let why, let started):
            failure = .init(kind: .connectionLost, responseStarted: started, description: why)
        case .invalidResponse:
            failure = .init(kind: .invalidResponse, responseStarted: true, description: failed.description)
        case .connectFailed:
            failure = .init(kind: .connect, responseStarted: false, description: failed.description)
        case .timedOut(let started):
            failure = .init(kind: .timeout, responseStarted: started, description: failed.description)
        }
        let now = EventLoop.monotonicNow
        let unsent = lifecycle.phase == .relaying && client.withdrawUnsentResponse()
        step { $0.upstreamFailed(failure, responseUnsent: unsent, now: now) }
    }
}
