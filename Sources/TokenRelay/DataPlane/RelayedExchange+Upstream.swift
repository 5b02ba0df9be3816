import HTTPTransport
import HTTPWire

/// The upstream connection of an exchange: acquiring one from the pool (or an HTTP/2 stream), sending the
/// request head with its credential and forwarding fields, and letting the connection go. Part of
/// `RelayedExchange` (RelayedExchange.swift: state, arrival, the client side).
extension RelayedExchange {
    // MARK: - Upstream connection

    /// `lane`: a request released by a refresh was admitted already and queues in order, never refused
    /// by the waiter bound meant for new arrivals. The wait itself is bounded by the machine's deadline.
    func acquireConnection(lane: HTTPTransport.UpstreamPool.Lane, fresh: Bool) {
        if let http2Pool = route.http2Pool, !http2Pool.serverChoseHTTP1 { return acquireStream(http2Pool, lane: lane) }
        let pool = route.pool
        if !fresh, let connection = pool.takeIdleConnection() { return connectionGranted(connection) }
        let ready: HTTPTransport.UpstreamPool.Grant = { [weak self] result in
            guard let self, !self.finished else {
                if case .success(let connection) = result { pool.release(connection) }
                return
            }
            self.ticket = nil
            let now = EventLoop.monotonicNow
            switch result {
            case .success(let connection): self.connectionGranted(connection)
            case .failure(.tooManyWaiters): self.step { $0.connectionRefused(now: now) }
            case .failure(let failure):
                let failure = RequestLifecycle.UpstreamFailure(kind: .connect, responseStarted: false, description: failure.description)
                self.step { $0.upstreamFailed(failure, now: now) }
            }
        }
        let ticket = fresh ? pool.acquireFresh(lane: lane, ready) : pool.acquire(lane: lane, ready)
        if ticket.isWaiting {
            self.ticket = ticket
            step { $0.connectionQueued() }
        }
    }

    /// The token is read now, not at arrival: a refresh may have finished while we waited.
    private func connectionGranted(_ connection: HTTPClientConnection) {
        upstream = connection
        let admission = lifecycle.passthrough ? nil : admissionAtArrival.take() ?? context.coordinator.admit()
        if case .send(_, let authorization) = admission { grantedAuthorization = authorization }
        let reused = connection.requestsStarted > 0, now = EventLoop.monotonicNow
        step { $0.connectionAcquired(reused: reused, admission: admission, now: now) }
    }

    func send(_ credential: RequestLifecycle.Credential) {
        guard let upstream else { return sendOnStream(credential) }
        sentAt = EventLoop.monotonicNow
        captured = nil
        upstream.handler = session   // which passes the reports on to this exchange (see ClientSession)
        upstream.setSilenceLimit(nil)
        switch body {
        case .kept(let bytes):
            // A POST, PUT or PATCH always says how long its body is, even when it is empty.
            let announcesLength = !bytes.isEmpty || head.method == .post || head.method == .put || head.method == .patch
            upstream.startRequest(method: upstreamMethod, target: upstreamTarget, body: announcesLength ? .known(bytes.count) : .none,
                                  upgrade: upgradeProtocol) { writeForwardedFields(into: &$0, credential) }
            if !bytes.isEmpty { upstream.sendBody(bytes) }
            upstream.finishRequest()
        case .streamed(let streamed):
            // The client is held back (its body waits in its socket), so the loop does not see it leave:
            // one that left while the request queued or was held must not get a head sent upstream (with
            // a fresh token) for a body that will never come. Ending it reports `clientGone` (499).
            if client.endIfPeerLeftWhilePaused() { return }
            // Sent with `Expect: 100-continue` whether or not the client asked: a 401 then comes before the
            // body leaves, and the request can still be replayed. The body flows from the upstream's 100
            // or the end of the wait (`connectionCanSendMore`).
            upstream.startRequest(method: upstreamMethod, target: upstreamTarget, body: streamed.length,
                                  continueWait: context.timeouts.continueSeconds) { writeForwardedFields(into: &$0, credential) }
            streamed.attach(upstream)
        }
    }

    /// The method as the upstream request names it: a literal for the standard methods (the parser matched
    /// their bytes exactly), so that no String is made from the head's bytes for every send.
    var upstreamMethod: String {
        switch head.method {
        case .get: "GET"
        case .head: "HEAD"
        case .post: "POST"
        case .put: "PUT"
        case .delete: "DELETE"
        case .options: "OPTIONS"
        case .patch: "PATCH"
        case .connect, .trace, .other: head.methodName
        }
    }

    /// The upstream request's fields, written straight into its head from the client's bytes: the client's
    /// end-to-end fields (`HeaderPolicy`), the forwarding fields (`ForwardingHeaders`), `Host`, and the token.
    /// Recomputed for each send (a replay is rare; keeping a copy would cost every request).
    func writeForwardedFields(into block: inout HTTPFieldBlock, _ credential: RequestLifecycle.Credential) {
        let keepAuthorization = passthrough
        // The running configuration's: a replay after a reload follows it.
        let forwarding = context.current.forwarding
        // Read field by field below: a copy of the whole `InjectSettings` would retain each of its strings.
        let context = self.context
        head.withFieldTable { table in
            ASCII.withBytes(of: context.injection.headerKey) { injectedHeader in
                ForwardingHeaders.write(table, forwarded: { index in
                    HeaderPolicy.forwardsRequestField(index, of: table, keepAuthorization: keepAuthorization, injectedHeader: injectedHeader)
                }, client: session.forwardedClient, settings: forwarding, into: &block)
            }
        }
        if let host = context.route.hostField { block.append(host) }
        if case .token = credential, let authorization = grantedAuthorization, let token = context.tokenField.field(for: authorization) {
            block.append(token)
            // A DPoP-bound token goes with a fresh proof for this very send (a replay or resend too: new jti, iat, nonce).
            if let dpop = context.dpop, authorization.utf8.starts(with: DPoPProofs.authorizationScheme.utf8),
               let proof = dpop.proof(method: upstreamMethod, target: upstreamTarget, server: context.dpopOrigin, authorization: authorization) {
                block.append(name: "DPoP", value: proof)
            }
        }
    }

    /// Gives the connection back; the pool closes it unless the response left it clean.
    func releaseUpstream() {
        guard let upstream else { return releaseStream() }
        self.upstream = nil
        streamed?.detach()
        upstream.handler = nil
        upstream.setSilenceLimit(nil)
        if upstreamReadingPaused {
            upstreamReadingPaused = false
            upstream.resumeReading()
        }
        route.pool.release(upstream)
    }

    /// Stops the request in flight: the connection is closed, never reused with half a response in it.
    func closeUpstream() {
        guard let upstream else { return releaseStream() }
        self.upstream = nil
        streamed?.detach()
        upstream.handler = nil
        upstream.close()
    }
}
