import HTTPTransport
import HTTPWire

/// How an exchange answers its client: the upstream's response relayed (or a 101 turned into a tunnel),
/// one of tokenrelay's own answers, or a kept 401 given back; and the end that lets go of everything the
/// exchange holds, exactly once. Part of `RelayedExchange` (RelayedExchange.swift: arrival, the machine's
/// actions, the upstream side).
extension RelayedExchange {
    // MARK: - Answers

    func startRelaying(_ response: ReceivedResponseHead) {
        if response.status == 101, let upgradeProtocol, let upstream { return switchProtocols(response, upstream, upgradeProtocol) }
        if proxy.isDraining { client.closeAfterResponse = true }
        // Between two pieces of the body the upstream may be silent only so long (an idle event stream
        // that died without a FIN must not hold the client for ever). The running configuration's limit.
        upstream?.setSilenceLimit(context.current.timeouts.streamIdleSeconds)
        http2?.stream?.setSilenceLimit(context.current.timeouts.streamIdleSeconds)
        let requestIsHead = head.method == .head
        response.withFieldTable { table in
            let length: BodyLength
            switch response.framing {
            case .none:
                // To HEAD: the would-be body's length is announced, its bytes never sent. The parser has
                // accepted the fields only if every value in them is the same length (`10, 10` included).
                var declaredLength: Int?
                if requestIsHead {
                    for index in 0..<table.count where table.nameIs(index, "content-length") {
                        ASCII.forEachListElement(table.value(index)) { declaredLength = ASCII.decimal($0) ?? declaredLength }
                    }
                }
                length = declaredLength.map { .known($0) } ?? .none
            case .length(let n): length = .known(n)
            case .chunked, .untilClose: length = .unknown
            }
            client.startResponse(status: response.status, reason: UnsafeRawBufferPointer(rebasing: table.bytes[response.parsed.reason]),
                                 body: length) { HeaderPolicy.writeForwardedResponseFields(table, into: &$0) }
        }
        // A large body of known length goes socket to socket in the kernel when both sides are plain TCP (the
        // transport checks that and the sizes); a relayed response is never captured, so nothing here needs it.
        if case .length = response.framing, !requestIsHead, let connection = client.http1Connection { _ = upstream?.spliceBody(to: connection) }
        // The head waits for the first body piece to share its write; when none came with it, it goes now:
        // an event stream's first event (or a slow body) may be long in coming, and the client must not wait
        // for it to see the head.
        if let upstream, !upstream.hasUnreadInput { client.flushPendingHead() }
        if http2 != nil { client.flushPendingHead() }
    }

    /// The upstream agreed to the upgrade: the connections become a tunnel and this exchange is done (the
    /// tunnel counts as in flight from here). The connection is the tunnel's, never the pool's again.
    func switchProtocols(_ response: ReceivedResponseHead, _ connection: HTTPClientConnection, _ requested: String) {
        upstream = nil
        connection.handler = nil
        let now = EventLoop.monotonicNow
        guard let clientConnection = client.http1Connection,
              UpgradeTunnel.open(proxy: proxy, client: clientConnection, upstream: connection, response: response, requestedProtocol: requested) else {
            connection.close()
            let failure = RequestLifecycle.UpstreamFailure(kind: .connectionLost, responseStarted: true,
                                                           description: "connection lost while switching protocols")
            return step { $0.upstreamFailed(failure, now: now) }
        }
        holdsTunnelSlot = false   // the tunnel's now: it gives it back when it closes
        step { $0.responseEnded(now: now) }
    }

    func respond(_ response: LocalResponse) {
        if response.status == 503 { proxy.answeredUnavailable(response) }
        if client.http1Connection == nil, HTTP2ClientSession.isGRPC(head) {
            return GRPCLocalAnswer.send(to: client, grpcStatus: GRPCLocalAnswer.status(forHTTPStatus: response.status),
                                        message: "tokenrelay: \(response.message)")
        }
        if proxy.isDraining { client.closeAfterResponse = true }
        client.respond(HTTPResponseHead(status: Int(response.status), reason: response.reason, fields: response.headers),
                       body: Array(response.body.utf8))
    }

    func respondCaptured() {
        guard let captured else { return respond(.loginRequired) }
        if proxy.isDraining { client.closeAfterResponse = true }
        // The transport writes Content-Length for the kept body, which may be shorter than the original.
        let response = captured.head
        // A gRPC refusal that came as a head and then trailers (no message) goes back Trailers-Only: its
        // status and message are in those trailers, and a head without them is no gRPC answer at all.
        let trailers = trailersBeforeData.flatMap { $0.trailersOnly ? nil : $0.fields } ?? []
        response.withFieldTable { table in
            client.respond(status: response.status, reason: UnsafeRawBufferPointer(rebasing: table.bytes[response.parsed.reason]),
                           body: captured.body) { block in
                HeaderPolicy.writeForwardedResponseFields(table, into: &block)
                for field in trailers { block.append(name: field.name, value: field.value) }
            }
        }
    }

    func giveBack(_ timer: DeadlineTimer?) {
        guard let timer else { return }
        timer.cancel()
        timer.exchange = nil
        session.returnDeadlineTimer(timer)
    }

    /// Frees everything the exchange still holds; the machine's last action, exactly once.
    func finish(_ summary: RequestLifecycle.Summary) {
        ticket?.cancel()
        ticket = nil
        giveBack(poolWaitTimer)
        giveBack(connectTimer)
        giveBack(responseHeadTimer)
        giveBack(holdTimer)
        poolWaitTimer = nil
        connectTimer = nil
        responseHeadTimer = nil
        holdTimer = nil
        // A connection still held at the end is mid-request (the client went away, or shutdown): closed.
        closeUpstream()
        if holdsTunnelSlot {
            holdsTunnelSlot = false
            proxy.giveBackTunnelSlot()
        }
        let status = Int32(clamping: summary.status)
        // The method and target are decoded for the access log only (a String each per request otherwise).
        let entry = context.current.accessLog.enabled
            ? AccessLogEntry(method: head.methodName, target: String(decoding: head.target, as: UTF8.self), status: status,
                             seconds: EventLoop.monotonicNow - arrivedAt, attempts: summary.attempts, generation: summary.generation)
            : nil
        var target: [UInt8] = []
        swap(&target, &upstreamTarget)
        session.returnTargetBuffer(&target)
        session.exchangeFinished(self)
        route.requestEnded()
        proxy.exchangeFinished(self, status: status, counters: context.requestCounters, entry: entry, hold: summary.hold)
        let retained = selfRetain
        selfRetain = nil
        retained?.release()
    }
}

/// How much of a kept 401's body is kept (`RelayedExchange.captured`).
let capturedBodyLimit = 64 * 1024

/// An upstream 401 kept for a possible replay (see `RelayedExchange.captured`). A class, so that the
/// exchange's empty slot for it costs nothing on the requests that never capture one.
final class CapturedResponse {
    let head: ReceivedResponseHead
    var body: [UInt8] = []

    init(head: ReceivedResponseHead) {
        self.head = head
    }
}

extension RelayedExchange {
    /// The exchange for a request whose head has arrived, on the context of the route its head picks; not
    /// begun, so that its session holds it before `begin` can report back.
    static func routed(by proxy: ProxyServer, session: Session, head: ReceivedRequestHead, body: Body) -> RelayedExchange {
        let chosen = proxy.context(for: head, listenerRoute: session.listenerRoute)
        return RelayedExchange(context: chosen.context, strip: chosen.strip, session: session, head: head, body: body)
    }
}
