import CoreMetrics
import Prometheus

/// The metrics tokenrelay exports on the admin listener's `/metrics`: recorded through the swift-metrics
/// API, kept and rendered in Prometheus text format by swift-prometheus (nothing is hand-formatted).
///
/// The factory is handed to each metric explicitly instead of bootstrapping the process-wide
/// `MetricsSystem`, so a test process can run several relays side by side without them sharing counters.
/// Labels have small fixed value sets (status codes, outcome names); nothing derived from a request
/// path or a token ever becomes a label. Confined to the event loop, except `exposition()`.
final class RelayMetrics {
    private let registry = PrometheusCollectorRegistry()
    private let factory: PrometheusMetricsFactory
    private var requestsByStatus: [Int: CoreMetrics.Counter] = [:]
    private var labelled: [String: CoreMetrics.Counter] = [:]

    let heldRequests: CoreMetrics.Gauge
    /// Open client connections on the proxy listener.
    let clientConnections: CoreMetrics.Gauge
    let replaysAfterRefresh: CoreMetrics.Counter
    let replaysStaleGeneration: CoreMetrics.Counter
    let tokenGeneration: CoreMetrics.Gauge
    let loginRequired: CoreMetrics.Gauge
    let tokenFileWriteFailures: CoreMetrics.Counter
    /// 1 while tokens in service (a rotated refresh token) could not be written to the token file.
    let unsavedTokens: CoreMetrics.Gauge
    let accessTokenExpiresAt: CoreMetrics.Gauge
    let secondsUntilExpiry: CoreMetrics.Gauge
    let lockWaits: CoreMetrics.Counter
    let adoptedRotations: CoreMetrics.Counter
    let stormGuardTrips: CoreMetrics.Counter
    /// Seconds of one exchange with the token endpoint.
    let refreshDuration: CoreMetrics.Recorder
    /// Seconds from sending a request upstream to its response headers.
    let upstreamLatency: CoreMetrics.Recorder
    /// Seconds from a request's hold to its answer, by how it was answered.
    private var holdDurations: [HoldOutcome: CoreMetrics.Recorder] = [:]

    init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        let latencyBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
        for name in ["tokenrelay_refresh_duration_seconds", "tokenrelay_upstream_response_seconds", "tokenrelay_hold_duration_seconds"] {
            factory.valueHistogramBuckets[name] = latencyBuckets
        }
        self.factory = factory
        heldRequests = Gauge(label: "tokenrelay_held_requests", factory: factory)
        clientConnections = Gauge(label: "tokenrelay_client_connections", factory: factory)
        replaysAfterRefresh = Counter(label: "tokenrelay_replays_total", dimensions: [("reason", "refreshed")], factory: factory)
        replaysStaleGeneration = Counter(label: "tokenrelay_replays_total", dimensions: [("reason", "stale_token")], factory: factory)
        tokenGeneration = Gauge(label: "tokenrelay_token_generation", factory: factory)
        loginRequired = Gauge(label: "tokenrelay_login_required", factory: factory)
        tokenFileWriteFailures = Counter(label: "tokenrelay_token_file_write_failures_total", factory: factory)
        unsavedTokens = Gauge(label: "tokenrelay_unsaved_tokens", factory: factory)
        accessTokenExpiresAt = Gauge(label: "tokenrelay_access_token_expiry_timestamp_seconds", factory: factory)
        secondsUntilExpiry = Gauge(label: "tokenrelay_access_token_remaining_seconds", factory: factory)
        lockWaits = Counter(label: "tokenrelay_token_lock_waits_total", factory: factory)
        adoptedRotations = Counter(label: "tokenrelay_adopted_rotations_total", factory: factory)
        stormGuardTrips = Counter(label: "tokenrelay_storm_guard_trips_total", factory: factory)
        refreshDuration = Recorder(label: "tokenrelay_refresh_duration_seconds", aggregate: true, factory: factory)
        upstreamLatency = Recorder(label: "tokenrelay_upstream_response_seconds", aggregate: true, factory: factory)
    }

    /// Client requests answered, by HTTP status (the hot path: counters are cached per status).
    func countRequest(status: Int) {
        if let counter = requestsByStatus[status] { return counter.increment() }
        let counter = Counter(label: "tokenrelay_requests_total", dimensions: [("status", String(status))], factory: factory)
        requestsByStatus[status] = counter
        counter.increment()
    }

    /// How a request that was held for a refresh ended (the label of `tokenrelay_hold_duration_seconds`).
    enum HoldOutcome: String {
        /// Sent again with the new token; whatever the upstream answered went to the client.
        case replayed
        /// tokenrelay answered 503 (hold timeout, no token could be obtained, overload).
        case unavailable
        /// The upstream's 401, or tokenrelay's own "login required".
        case unauthorized
        /// The client hung up first.
        case clientGone = "client_gone"
        case other
    }

    /// A held request was answered (or its client left) `seconds` after its hold began.
    func recordHold(seconds: Double, outcome: HoldOutcome) {
        if let recorder = holdDurations[outcome] { return recorder.record(seconds) }
        let recorder = Recorder(label: "tokenrelay_hold_duration_seconds", dimensions: [("outcome", outcome.rawValue)], aggregate: true,
                                factory: factory)
        holdDurations[outcome] = recorder
        recorder.record(seconds)
    }

    /// Token refresh attempts, by outcome (success, rejected, transient_failure, invalid_response).
    func countRefresh(outcome: String) {
        counter("tokenrelay_refreshes_total", "outcome", outcome).increment()
    }

    /// Refresh cycles started, by trigger (expiring = proactive, unauthorized, forced, …).
    func countRefreshStarted(trigger: String) {
        counter("tokenrelay_refresh_cycles_total", "trigger", trigger).increment()
    }

    /// Refreshes the token endpoint refused, by OAuth `error` code (`invalid_grant` means a new login).
    func countRefreshError(code: String) {
        counter("tokenrelay_refresh_errors_total", "error", code).increment()
    }

    /// What `limits.max_client_connections` made us do: closed_idle, refused (503), paused_accepting.
    func countClientConnectionLimit(action: String) {
        counter("tokenrelay_client_connection_limit_total", "action", action).increment()
    }

    /// Upstream requests that failed without a response, by kind (connect, timeout, tls, …).
    func countUpstreamError(kind: String) {
        counter("tokenrelay_upstream_errors_total", "kind", kind).increment()
    }

    private func counter(_ name: String, _ label: String, _ value: String) -> CoreMetrics.Counter {
        let key = "\(name)\u{0}\(value)"
        if let counter = labelled[key] { return counter }
        let counter = Counter(label: name, dimensions: [(label, value)], factory: factory)
        labelled[key] = counter
        return counter
    }

    func exposition() -> String { registry.emitToString() }
}
