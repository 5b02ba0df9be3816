import CLibevent
import Logging

/// The proxied listener: accepts client requests, owns the upstream pool and the list of requests
/// held for a refresh, and keeps the counts that graceful shutdown waits on.
final class ProxyServer {
    let loop: EventLoop
    let config: Config
    let coordinator: RefreshCoordinator
    let pool: UpstreamPool
    let clientConnections: ClientConnections
    let metrics: RelayMetrics
    let logger: Logger
    var upstream: HTTPEndpoint { config.upstream.url }
    private(set) var listener: HTTPListener!
    /// Requests waiting for a refresh, oldest first (bounded by limits.max_held_requests).
    private var held: [Exchange] = []
    private var active: [ObjectIdentifier: Exchange] = [:]
    private(set) var isDraining = false
    /// Final responses handed to evhttp during the drain but not yet written out: exiting before they
    /// are would cut them off.
    private var unflushedResponses = 0
    /// Called when draining and the last exchange has finished.
    var onDrained: (() -> Void)?

    init(loop: EventLoop, config: Config, upstreamTLS: TLSContext?, coordinator: RefreshCoordinator, metrics: RelayMetrics,
         logger: Logger) throws {
        self.loop = loop
        self.config = config
        self.coordinator = coordinator
        self.metrics = metrics
        self.logger = logger
        let connections = HTTPConnectionFactory(loop: loop, endpoint: config.upstream.url, tls: upstreamTLS,
                                                timeoutSeconds: config.timeouts.upstreamSeconds)
        pool = UpstreamPool(loop: loop, factory: connections, maxConnections: config.limits.maxUpstreamConnections,
                            maxWaiters: config.limits.maxUpstreamWaiters,
                            timeouts: .init(response: config.timeouts.upstreamSeconds, streamIdle: config.timeouts.streamIdleSeconds,
                                            idle: config.timeouts.poolIdleSeconds))
        clientConnections = ClientConnections(loop: loop, maxConnections: config.limits.maxClientConnections, metrics: metrics,
                                              logger: logger)
        listener = try HTTPListener(loop: loop, host: config.listen.host, port: config.listen.port) { [unowned self] request in
            self.accept(request)
        }
        listener.setLimits(maxHeaderBytes: config.limits.maxHeaderBytes, maxBodyBytes: config.limits.maxBodyBytes,
                           timeoutSeconds: config.timeouts.clientSeconds)
        listener.setBacklog(config.limits.listenBacklog)
        listener.track(clientConnections)
        targets = RequestTarget(upstream: config.upstream.url, listenHost: config.listen.host, listenPort: listener.boundPort)
        coordinator.onOutcome = { [unowned self] outcome in self.refreshFinished(outcome) }
        pool.onDesyncedConnection = { [unowned self] unread in
            self.metrics.countUpstreamError(kind: "excess_response_bytes")
            self.logger.warning("upstream sent more data than its response; connection closed, not reused",
                                metadata: ["unread_bytes": "\(unread)"])
        }
    }

    private func accept(_ request: OpaquePointer) {
        let exchange = Exchange(proxy: self, request: request)
        active[ObjectIdentifier(exchange)] = exchange
        exchange.begin()
    }

    /// Paths forwarded untouched (no token, no refresh): an API's own login endpoints. A prefix matches on
    /// a segment boundary: `/public` covers `/public` and `/public/x`, never `/publicity`.
    func isPassthrough(_ target: String) -> Bool {
        guard !config.upstream.passthroughPrefixes.isEmpty else { return false }
        var base = upstream.path
        while base.hasSuffix("/") { base.removeLast() }
        let path = target.dropFirst(base.count)
        return config.upstream.passthroughPrefixes.contains { prefix in
            guard path.hasPrefix(prefix) else { return false }
            if prefix.hasSuffix("/") { return true }
            let rest = path.dropFirst(prefix.count)
            return rest.isEmpty || rest.first == "/" || rest.first == "?"
        }
    }

    /// Maps request targets onto the upstream; built once the listener knows its port.
    private(set) var targets: RequestTarget!

    /// Every 503 tokenrelay answers by itself (no token, too many held or waiting requests, too many busy
    /// connections, shutting down): logged with its reason, at most once a second per reason.
    func answeredUnavailable(_ response: LocalResponse) {
        let (allowed, heldBack) = unavailableLog.admit(response.message, now: EventLoop.monotonicNow)
        guard allowed else { return }
        var metadata: Logger.Metadata = ["error": "\(response.error)", "reason": "\(response.message)"]
        if heldBack > 0 { metadata["more_since_last_line"] = "\(heldBack)" }
        logger.info("request answered by tokenrelay: service unavailable", metadata: metadata)
    }
    private var unavailableLog = LogRateLimiter(interval: 1)

    /// A request refused before anything was forwarded (smuggling probes, foreign hosts).
    func refused(_ reason: String) {
        logger.info("request refused", metadata: ["reason": "\(reason)"])
    }

    // MARK: - Held requests

    func hold(_ exchange: Exchange) -> Bool {
        if held.contains(where: { $0 === exchange }) { return true }
        guard held.count < config.limits.maxHeldRequests else { return false }
        held.append(exchange)
        metrics.heldRequests.record(Double(held.count))
        return true
    }

    func unhold(_ exchange: Exchange) {
        guard let index = held.firstIndex(where: { $0 === exchange }) else { return }
        held.remove(at: index)
        metrics.heldRequests.record(Double(held.count))
    }

    var heldCount: Int { held.count }

    /// Releases every held request, oldest first, with the outcome of the refresh.
    private func refreshFinished(_ outcome: RefreshCoordinator.Outcome) {
        let waiting = held
        held = []
        metrics.heldRequests.record(0)
        waiting.forEach { $0.refreshFinished(outcome) }
    }

    // MARK: - Accounting

    func upstreamFailed(_ failure: OutgoingFailure) {
        metrics.countUpstreamError(kind: failure.kind.rawValue)
        logger.warning("upstream request failed", metadata: ["reason": "\(failure)"])
    }

    var activeCount: Int { active.count }

    func exchangeFinished(_ exchange: Exchange, status: Int32, summary: AccessLogEntry) {
        active.removeValue(forKey: ObjectIdentifier(exchange))
        if status > 0 { metrics.countRequest(status: Int(status)) }
        if config.accessLog.enabled { summary.log(to: logger, includeQuery: config.accessLog.includeQuery) }
        checkDrained()
    }

    /// Called just before a final response is handed to evhttp. While draining, the process waits for
    /// it to be written out (a client that vanishes instead is covered by the drain timeout).
    func willSendFinalResponse(_ request: OpaquePointer) {
        guard isDraining else { return }
        unflushedResponses += 1
        evhttp_request_set_on_complete_cb(request, responseFlushedTrampoline, unretainedContext(self))
    }

    func responseFlushed() {
        unflushedResponses -= 1
        checkDrained()
    }

    /// Drained: no exchange left, every final response written out, and no exchange with the token
    /// endpoint in flight (its answer may hold the only copy of a rotated refresh token, which must
    /// reach the token file before the process exits).
    func checkDrained() {
        if isDraining && active.isEmpty && unflushedResponses == 0 && !coordinator.isTalkingToTokenEndpoint { onDrained?() }
    }

    // MARK: - Shutdown

    func startDraining() {
        isDraining = true
        coordinator.stopRefreshing()
        coordinator.onTokenEndpointIdle = { [unowned self] in self.checkDrained() }
        listener.stopAccepting()
        checkDrained()
    }

    /// Drain deadline passed: answer or cut whatever is left.
    func abandonRemaining() {
        Array(active.values).forEach { $0.abandon() }
    }
}
