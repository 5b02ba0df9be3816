import HTTPTransport
import Logging

/// What the proxy counts and logs as exchanges and tunnels end, the tunnel slots, and the drain check. Part
/// of `ProxyServer` (ProxyServer.swift: identities, routes, contexts and pools, shutdown).
extension ProxyServer {
    // MARK: - Accounting

    func upstreamFailed(_ failure: RequestLifecycle.UpstreamFailure) {
        metrics.countUpstreamError(kind: failure.kind.rawValue)
        logger.warning("upstream request failed", metadata: ["reason": "\(failure)"])
    }

    /// `entry`: the access-log line, made only while the access log is on (nil otherwise). `hold`: the
    /// machine's hold record for a request that was held (duration and outcome).
    func exchangeFinished(_ exchange: any ProxiedExchange, status: Int32, counters: RelayMetrics.RequestCounters, entry: AccessLogEntry?,
                          hold: (seconds: Double, outcome: RequestLifecycle.HoldOutcome)? = nil) {
        if let hold, let outcome = RelayMetrics.HoldOutcome(rawValue: hold.outcome.rawValue) {
            metrics.recordHold(seconds: hold.seconds, outcome: outcome)
        }
        removeActive(exchange)
        if status > 0 { counters.count(status: Int(status)) }
        if let entry, config.accessLog.enabled { entry.log(to: logger, includeQuery: config.accessLog.includeQuery) }
        checkDrained()
    }

    /// False at the limit: the handshake is answered 503 before it goes upstream.
    func takeTunnelSlot() -> Bool {
        guard tunnelSlotsTaken < config.limits.maxTunnels else { return false }
        tunnelSlotsTaken += 1
        return true
    }

    func giveBackTunnelSlot() {
        tunnelSlotsTaken = max(0, tunnelSlotsTaken - 1)
    }

    /// An upgraded connection (`UpgradeTunnel`) has closed: it no longer holds up a drain, and its slot is free.
    func tunnelEnded(_ tunnel: any ProxiedExchange) {
        giveBackTunnelSlot()
        removeActive(tunnel)
        checkDrained()
    }

    /// Drained: no exchange left, every final response written out (HTTP/2 connections closed: they write
    /// once per loop iteration and close after their GOAWAY and last stream), and no exchange with the token
    /// endpoint in flight (its answer may hold the only copy of a rotated refresh token, which must
    /// reach the token file before the process exits).
    func checkDrained() {
        if isDraining && activeCount == 0 && !(coordinators + retiredCoordinators).contains(where: \.isTalkingToTokenEndpoint) && frontEnd.openHTTP2Connections == 0 { onDrained?() }
    }
}
