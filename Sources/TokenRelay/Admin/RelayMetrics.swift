import Prometheus

/// The metrics tokenrelay exports on the admin listener's `/metrics`, in Prometheus text format.
///
/// Labels have small fixed value sets (status codes, outcome names); nothing derived from a request
/// path or a token ever becomes a label. Confined to the event loop, except `exposition()`.
final class RelayMetrics {
    let registry = PrometheusCollectorRegistry()
    private var requestsByStatus: [Int: Counter] = [:]
    private var refreshesByOutcome: [String: Counter] = [:]
    private var upstreamErrorsByKind: [String: Counter] = [:]
    let heldRequests: Gauge
    let replaysAfterRefresh: Counter
    let replaysStaleGeneration: Counter
    let tokenGeneration: Gauge
    let loginRequired: Gauge
    let tokenFileWriteFailures: Counter
    let accessTokenExpiresAt: Gauge
    let secondsUntilExpiry: Gauge
    let lockWaits: Counter
    let adoptedRotations: Counter
    let stormGuardTrips: Counter
    private var refreshesByTrigger: [String: Counter] = [:]
    private var refreshErrorsByCode: [String: Counter] = [:]
    let refreshDuration: DurationHistogram
    let upstreamLatency: ValueHistogram
    let holdDuration: ValueHistogram

    private static let replaysHelp = "Requests sent again with a newer access token, by reason"

    init() {
        heldRequests = registry.makeGauge(descriptor: Self.name("held_requests", unit: "", help: "Requests waiting for a token refresh"))
        replaysAfterRefresh = registry.makeCounter(descriptor: Self.name("replays", unit: "total", help: Self.replaysHelp),
                                                   labels: [("reason", "refreshed")])
        replaysStaleGeneration = registry.makeCounter(descriptor: Self.name("replays", unit: "total", help: Self.replaysHelp),
                                                      labels: [("reason", "stale_token")])
        tokenGeneration = registry.makeGauge(descriptor: Self.name("token_generation", unit: "", help: "Current access-token generation"))
        loginRequired = registry.makeGauge(descriptor: Self.name(
            "login_required", unit: "", help: "1 while the refresh token was rejected and a new login is needed"))
        tokenFileWriteFailures = registry.makeCounter(descriptor: Self.name("token_file_write_failures", unit: "total",
                                                                            help: "Failed writes of the token file"))
        accessTokenExpiresAt = registry.makeGauge(descriptor: Self.name(
            "access_token_expiry_timestamp", unit: "seconds", help: "Expiry of the current access token (Unix time; 0 when unknown)"))
        secondsUntilExpiry = registry.makeGauge(descriptor: Self.name(
            "access_token_remaining", unit: "seconds", help: "Seconds until the current access token expires (-1 when unknown)"))
        lockWaits = registry.makeCounter(descriptor: Self.name(
            "token_lock_waits", unit: "total", help: "Refreshes that had to wait for another process holding the token file lock"))
        adoptedRotations = registry.makeCounter(descriptor: Self.name(
            "adopted_rotations", unit: "total", help: "Tokens taken from the token file instead of refreshing (rotated by another process or an operator)"))
        refreshDuration = registry.makeDurationHistogram(
            descriptor: Self.name("refresh_duration", unit: "seconds", help: "Duration of one exchange with the token endpoint"),
            buckets: [.milliseconds(10), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
                      .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10)])
        let latencyBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
        upstreamLatency = registry.makeValueHistogram(
            descriptor: Self.name("upstream_response", unit: "seconds", help: "Time from sending a request upstream to its response headers"),
            buckets: latencyBuckets)
        holdDuration = registry.makeValueHistogram(
            descriptor: Self.name("hold_duration", unit: "seconds", help: "Time requests spent held waiting for a token refresh"),
            buckets: latencyBuckets)
        stormGuardTrips = registry.makeCounter(descriptor: Self.name(
            "storm_guard_trips", unit: "total", help: "Times the refresh storm guard stopped refreshing"))
    }

    func countRefreshStarted(trigger: String) {
        counter(in: &refreshesByTrigger, Self.name("refresh_cycles", unit: "total", help: "Refresh cycles started, by trigger (proactive, unauthorized, forced)"),
                label: "trigger", value: trigger).increment()
    }

    private static func name(_ metric: String, unit: String, help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "tokenrelay", metricName: metric, unitName: unit, helpText: help)
    }

    func countRequest(status: Int) {
        if let counter = requestsByStatus[status] { return counter.increment() }
        let counter = registry.makeCounter(descriptor: Self.name("requests", unit: "total", help: "Client requests answered, by HTTP status"),
                                           labels: [("status", String(status))])
        requestsByStatus[status] = counter
        counter.increment()
    }

    func countRefresh(outcome: String) {
        counter(in: &refreshesByOutcome, Self.name("refreshes", unit: "total", help: "Token refresh attempts, by outcome"),
                label: "outcome", value: outcome).increment()
    }

    /// Refreshes the token endpoint refused, by OAuth `error` code (`invalid_grant` means a new login).
    func countRefreshError(code: String) {
        counter(in: &refreshErrorsByCode, Self.name("refresh_errors", unit: "total", help: "Refreshes refused by the token endpoint, by OAuth error code"),
                label: "error", value: code).increment()
    }

    func countUpstreamError(kind: String) {
        counter(in: &upstreamErrorsByKind, Self.name("upstream_errors", unit: "total", help: "Upstream requests that failed without a response"),
                label: "kind", value: kind).increment()
    }

    private func counter(in cache: inout [String: Counter], _ descriptor: MetricNameDescriptor, label: String, value: String) -> Counter {
        if let counter = cache[value] { return counter }
        let counter = registry.makeCounter(descriptor: descriptor, labels: [(label, value)])
        cache[value] = counter
        return counter
    }

    func exposition() -> String { registry.emitToString() }
}
