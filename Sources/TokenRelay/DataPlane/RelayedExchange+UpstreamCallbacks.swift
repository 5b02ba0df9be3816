import HTTPTransport
import HTTPWire

/// What the upstream connection reports (head, body, end, its own end) turned into the machine's events;
/// `upstreamReceivedHead`/`upstreamReceivedBody` serve the HTTP/2 upstream too. Part of `RelayedExchange`
/// (RelayedExchange.swift: state, arrival, the client side).
extension RelayedExchange {
    // MARK: - Upstream callbacks

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}

    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        guard connection === upstream else { return }
        upstreamReceivedHead(head, bodyBytesSent: connection.bodyBytesSentBeforeResponse)
    }

    /// A response head from the upstream, either protocol: the refresh decision and the machine's event.
    /// `bodyBytesSent`: body bytes of a streamed request that had left before it.
    func upstreamReceivedHead(_ head: ReceivedResponseHead, bodyBytesSent: Int) {
        if http2?.headLatencyRecorded != true { context.metrics.upstreamLatency.record(EventLoop.monotonicNow - sentAt) }
        // Nobody asked to switch protocols: what follows is not HTTP, and must not reach the client as such.
        if head.status == 101 && upgradeProtocol == nil {
            closeUpstream()
            let failure = RequestLifecycle.UpstreamFailure(kind: .invalidResponse, responseStarted: true,
                                                           description: "invalid HTTP response: interim 101 to a request that did not ask for an upgrade")
            let now = EventLoop.monotonicNow
            return step { $0.upstreamFailed(failure, now: now) }
        }
        // The transport's count is the truth about the body: a byte handed to the socket may have been read.
        if streamed != nil && bodyBytesSent > 0 {
            var machine = lifecycle
            machine.streamedBodyStarted()
            lifecycle = machine
        }
        if let dpop = context.dpop, !passthrough, noteNonce(head, dpop), head.status == 401 {
            var challenges: [String] = []
            head.withFieldTable { table in
                for index in 0..<table.count where table.nameIs(index, "www-authenticate") {
                    challenges.append(String(decoding: table.value(index), as: UTF8.self))
                }
            }
            if RefreshTrigger.isNonceChallenge(status: head.status, challenges: challenges) {
                return step(arriving: head) { $0.nonceChallenged(status: head.status) }
            }
        }
        // Challenges are read only for a refresh-triggering status: most responses are not one. The running
        // configuration's statuses, as before the context existed.
        let running = context.current
        var expired = false
        if running.triggerStatusSet.contains(head.status) {
            var challenges: [String] = []
            head.withFieldTable { table in
                for index in 0..<table.count where table.nameIs(index, "www-authenticate") {
                    challenges.append(String(decoding: table.value(index), as: UTF8.self))
                }
            }
            expired = RefreshTrigger.indicatesExpiredToken(status: head.status, challenges: challenges,
                                                           triggerStatuses: running.triggerStatuses)
        }
        // A gRPC answer that ended with no message (HTTP/2 upstreams only; its head was withheld until then):
        // its status is in the trailers it ended with (Trailers-Only: the head's own fields), and decides like
        // a 401 (`RequestLifecycle+GRPC`); an HTTP status that triggers (a gateway's bare 401) still does.
        if let early = trailersBeforeData, http2?.isGRPC == true {
            let refused = expired || GRPCRefreshTrigger.indicatesExpiredToken(grpcStatus: early.field("grpc-status"),
                                                                              triggerStatuses: running.triggerGRPCStatuses)
            return step(arriving: head) { $0.grpcStatusBeforeMessage(status: head.status, indicatesExpiredToken: refused) }
        }
        step(arriving: head) { $0.responseHead(status: head.status, indicatesExpiredToken: expired) }
    }

    /// Keeps the upstream's latest `DPoP-Nonce` (RFC 9449 §9: any response may bring one); whether one was accepted.
    private func noteNonce(_ head: ReceivedResponseHead, _ dpop: DPoPProofs) -> Bool {
        var accepted = false
        let origin = context.dpopOrigin
        head.withFieldTable { table in
            for index in 0..<table.count where table.nameIs(index, "dpop-nonce") {
                accepted = dpop.received(nonce: table.value(index), from: origin)
            }
        }
        return accepted
    }

    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        guard connection === upstream else { return }
        upstreamReceivedBody(bytes)
    }

    /// A piece of the response body, either protocol: kept (a 401 for a replay) or relayed.
    func upstreamReceivedBody(_ bytes: UnsafeRawBufferPointer) {
        switch lifecycle.phase {
        case .capturing:
            guard let captured else { break }
            let room = Self.maxCapturedBodyBytes - captured.body.count
            if room > 0 { captured.body.append(contentsOf: bytes.prefix(room)) }
        case .relaying:
            client.sendBody(bytes)
            // The client is slower than the upstream: stop reading the upstream until it has drained.
            if !client.canSendMore && !upstreamReadingPaused {
                upstreamReadingPaused = true
                upstream?.pauseReading()
                http2?.stream?.pauseReading()
            }
        default:
            break
        }
    }

    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        guard connection === upstream else { return }
        let now = EventLoop.monotonicNow
        step { $0.responseEnded(now: now) }
    }

    func connectionCanSendMore(_ connection: HTTPClientConnection) {
        guard connection === upstream, !finished else { return }
        streamed?.upstreamCanTakeMore(connection)
    }

    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        guard connection === upstream else { return }
        // "alpn": the server now selects h2; the machine's fresh-connection retry takes the HTTP/2 path.
        if connection.serverSelectedHTTP2 { route.http2Pool?.serverMaySpeakHTTP2() }
        var failure = TransportUpstream.failure(ended, responseStarted: responseStarted, connected: connection.isConnected)
        if let status = connection.statusUnreadAtFailure {
            // Still a 502 (the answer was not read), but the log says what the upstream meant.
            failure.description += " (the upstream had answered \(status) and closed without reading the rest of the request body)"
        }
        upstream = nil
        streamed?.detach()
        connection.handler = nil
        let now = EventLoop.monotonicNow
        // A head still waiting for its first body piece has not reached the client: it gets a 502 instead.
        let unsent = lifecycle.phase == .relaying && client.withdrawUnsentResponse()
        step { $0.upstreamFailed(failure, responseUnsent: unsent, now: now) }
    }
}
