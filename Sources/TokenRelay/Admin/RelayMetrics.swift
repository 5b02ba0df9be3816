import Prometheus

/// The metrics tokenrelay exports on the admin listener's `/metrics`: kept and rendered in Prometheus
/// text format by swift-prometheus (nothing is hand-formatted).
///
/// Every metric is made through the registry with its help text, so each family gets a `# HELP` line
/// (the swift-metrics factory API registers them with empty help, which renders none). The registry
/// insists that one name keeps one help text, so each family's text lives in one place here (`Family`).
/// Each relay has its own registry instead of the process-wide one, so a test process can run several
/// relays side by side without them sharing counters.
/// Labels have small fixed value sets (status codes, outcome names, identity names from the config);
/// nothing derived from a request path or a token ever becomes a label. Confined to the event loop,
/// except `exposition()`.
///
/// With `identities`, each identity has its own instance over the one registry: the refresh and token
/// metrics carry `identity` (`default` for the top-level one), so one identity's gauges (login required,
/// generation, expiry) never overwrite another's. The request and connection metrics are the process's,
/// unlabelled as before. Without identities nothing changes: no `identity` label anywhere.
final class RelayMetrics {
    /// A metric family: its name and the help text every series of it shares.
    struct Family {
        let name: String
        let help: String

        /// The full name goes in as is (no namespace or unit suffix is added).
        var descriptor: MetricNameDescriptor { MetricNameDescriptor(metricName: name, unitName: "", helpText: help) }
    }

    enum Families {
        static let requests = Family(name: "tokenrelay_requests_total", help: "Client requests answered, by HTTP status.")
        static let refreshes = Family(name: "tokenrelay_refreshes_total",
                                      help: "Exchanges with the token endpoint, by outcome (success, rejected, transient_failure, invalid_response).")
        static let refreshCycles = Family(name: "tokenrelay_refresh_cycles_total",
                                          help: "Refresh cycles started, by trigger (expiring, expired, unauthorized, forced, no_token).")
        static let refreshErrors = Family(name: "tokenrelay_refresh_errors_total",
                                          help: "Refreshes the token endpoint refused, by OAuth error code (invalid_grant means a new login is needed).")
        static let connectionLimit = Family(name: "tokenrelay_client_connection_limit_total",
                                            help: "Actions taken at limits.max_client_connections (closed_idle, closed_slow_head, refused, paused_accepting).")
        static let adminConnectionLimit = Family(name: "tokenrelay_admin_connection_limit_total",
                                                 help: "Actions taken at the admin listener's connection limit (closed_idle, closed_slow_head, refused, paused_accepting).")
        static let upstreamErrors = Family(name: "tokenrelay_upstream_errors_total",
                                           help: "Upstream requests that failed without a response, by kind (connect, timeout, tls, ...).")
        static let storeAdoptions = Family(name: "tokenrelay_token_store_adoptions_total",
                                           help: "Token sets written by another relay and adopted from Redis, by how they reached us (publish, poll, lock, conflict, reread).")
        static let replays = Family(name: "tokenrelay_replays_total",
                                    help: "Requests sent upstream again after a 401, by reason (refreshed: after a refresh; stale_token: sent with an older token).")
        static let holdDuration = Family(name: "tokenrelay_hold_duration_seconds",
                                         help: "Seconds from a request's hold for a token refresh to its answer, by outcome (replayed, unavailable, unauthorized, client_gone, other).")
        static let configReloads = Family(name: "tokenrelay_config_reloads_total",
                                          help: "Configuration reloads (SIGHUP), by outcome (applied, invalid, needs_restart).")
    }

    private let registry: PrometheusCollectorRegistry
    /// `[("identity", name)]` on every refresh and token metric, or nothing without identities.
    private let identityLabels: [(String, String)]
    /// Client requests by status, without a route label (a config without routes, and answers given
    /// before a request has a route).
    private(set) lazy var requests = RequestCounters(registry: registry, route: nil)
    private var labelled: [String: Counter] = [:]
    /// The `identity`-labelled counters made on demand (by outcome, trigger, ...), for `retire`.
    private var identityLabelled: [Counter] = []
    /// A reload removed this identity: its series are gone from /metrics and none is made again.
    private var isRetired = false

    let heldRequests: Gauge
    /// Open client connections on the proxy listener.
    let clientConnections: Gauge
    let replaysAfterRefresh: Counter
    let replaysStaleGeneration: Counter
    let tokenGeneration: Gauge
    let loginRequired: Gauge
    let tokenFileWriteFailures: Counter
    /// 1 while tokens in service (a rotated refresh token) could not be written to the token file.
    let unsavedTokens: Gauge
    let accessTokenExpiresAt: Gauge
    let secondsUntilExpiry: Gauge
    let lockWaits: Counter
    let adoptedRotations: Counter
    let stormGuardTrips: Counter
    /// Fleet mode (`tokens.redis`): the store's connection, its lock, its compare-and-set.
    let storeConnected: Gauge
    let storeLockAcquisitions: Counter
    let storeConflicts: Counter
    /// Fleet mode across a failover: READONLY replies (a node turned replica under us).
    let storeReadOnlyReplies: Counter
    /// Token sets written back over a lower stored version (a write lost in a failover).
    let storeWritesPutBack: Counter
    /// Masters changed under `tokens.redis.sentinel` (a failover followed to the new master).
    let storeFailoversFollowed: Counter
    /// DPoP (`dpop`): 1 while proofs are signed; nonce challenges answered by a resend; proofs signed.
    let dpopEnabled: Gauge
    let dpopNonceReplays: Counter
    let dpopProofsSigned: Counter
    /// Seconds of one exchange with the token endpoint.
    let refreshDuration: ValueHistogram
    /// Seconds from sending a request upstream to its response headers.
    let upstreamLatency: ValueHistogram
    /// Seconds from a request's hold to its answer, by how it was answered.
    private var holdDurations: [HoldOutcome: ValueHistogram] = [:]
    private let latencyBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]

    /// `identity`: the label value of this instance's refresh and token metrics (nil: no label, the single
    /// identity of a config without `identities`). `sharing`: the instance whose registry this one adds to.
    init(identity: String? = nil, sharing: RelayMetrics? = nil) {
        let latencyBuckets = self.latencyBuckets
        let registry = sharing?.registry ?? PrometheusCollectorRegistry()
        self.registry = registry
        let identityLabels = identity.map { [("identity", $0)] } ?? []
        self.identityLabels = identityLabels
        func gauge(_ name: String, _ help: String) -> Gauge { registry.makeGauge(descriptor: Family(name: name, help: help).descriptor) }
        func counter(_ name: String, _ help: String) -> Counter { registry.makeCounter(descriptor: Family(name: name, help: help).descriptor) }
        func histogram(_ name: String, _ help: String) -> ValueHistogram {
            registry.makeValueHistogram(descriptor: Family(name: name, help: help).descriptor, buckets: latencyBuckets)
        }
        // The identity's own: labelled with it when there are identities.
        func identityGauge(_ name: String, _ help: String) -> Gauge {
            identityLabels.isEmpty ? gauge(name, help) : registry.makeGauge(descriptor: Family(name: name, help: help).descriptor, labels: identityLabels)
        }
        func identityCounter(_ name: String, _ help: String) -> Counter {
            identityLabels.isEmpty ? counter(name, help) : registry.makeCounter(descriptor: Family(name: name, help: help).descriptor, labels: identityLabels)
        }
        heldRequests = gauge("tokenrelay_held_requests", "Requests currently held waiting for a token refresh.")
        clientConnections = gauge("tokenrelay_client_connections", "Open client connections on the proxy listener.")
        replaysAfterRefresh = registry.makeCounter(descriptor: Families.replays.descriptor, labels: [("reason", "refreshed")])
        replaysStaleGeneration = registry.makeCounter(descriptor: Families.replays.descriptor, labels: [("reason", "stale_token")])
        tokenGeneration = identityGauge("tokenrelay_token_generation", "Generation of the access token in use; grows by one per new token.")
        loginRequired = identityGauge("tokenrelay_login_required", "1 while the refresh credentials are refused and a new login is needed, else 0.")
        tokenFileWriteFailures = identityCounter("tokenrelay_token_file_write_failures_total",
                                         "Refreshed tokens that could not be written to the token file (kept in memory only).")
        unsavedTokens = identityGauge("tokenrelay_unsaved_tokens",
                              "1 while tokens in service (a rotated refresh token) could not be written to the token file; the write is retried.")
        accessTokenExpiresAt = identityGauge("tokenrelay_access_token_expiry_timestamp_seconds",
                                     "Unix time the current access token expires; 0 when unknown.")
        secondsUntilExpiry = identityGauge("tokenrelay_access_token_remaining_seconds",
                                   "Seconds until the current access token expires; -1 when unknown.")
        lockWaits = identityCounter("tokenrelay_token_lock_waits_total", "Refresh attempts that waited for another process's lock on the token file.")
        adoptedRotations = identityCounter("tokenrelay_adopted_rotations_total",
                                   "Tokens adopted from the token file (written by another process, token import, an operator).")
        stormGuardTrips = identityCounter("tokenrelay_storm_guard_trips_total",
                                  "Times the storm guard paused refreshing after too many 401-triggered refreshes.")
        storeConnected = identityGauge("tokenrelay_token_store_connected",
                               "1 while the token store can be reached (always 1 for a token file; Redis: connected and answering), else 0.")
        storeConnected.record(1)
        storeLockAcquisitions = identityCounter("tokenrelay_token_store_lock_acquisitions_total",
                                        "Refresh locks this relay acquired (the token file's flock, or the Redis lock).")
        storeConflicts = identityCounter("tokenrelay_token_store_cas_conflicts_total",
                                 "Writes to Redis that lost their compare-and-set to a newer version (the stored one was adopted instead).")
        storeReadOnlyReplies = identityCounter("tokenrelay_token_store_readonly_replies_total",
                                               "Redis writes answered READONLY (the node had become a replica); the store is unavailable until a master answers.")
        storeWritesPutBack = identityCounter("tokenrelay_token_store_writes_put_back_total",
                                             "Token sets written back to Redis because it held a lower version than this relay had seen (a write lost in a failover).")
        storeFailoversFollowed = identityCounter("tokenrelay_token_store_failovers_followed_total",
                                                 "Redis failovers followed through the sentinels (a new master confirmed by ROLE).")
        dpopEnabled = identityGauge("tokenrelay_dpop_enabled", "1 when DPoP proofs are signed for the tokens (dpop configured), else 0.")
        dpopNonceReplays = identityCounter("tokenrelay_dpop_nonce_replays_total",
                                           "Requests sent again with a fresh DPoP proof after a nonce challenge (use_dpop_nonce), upstream or token endpoint.")
        dpopProofsSigned = identityCounter("tokenrelay_dpop_proofs_signed_total", "DPoP proofs signed (proxied requests and token requests).")
        refreshDuration = identityLabels.isEmpty ? histogram("tokenrelay_refresh_duration_seconds", "Seconds of one exchange with the token endpoint.")
            : registry.makeValueHistogram(descriptor: Family(name: "tokenrelay_refresh_duration_seconds", help: "Seconds of one exchange with the token endpoint.").descriptor,
                                          labels: identityLabels, buckets: latencyBuckets)
        upstreamLatency = histogram("tokenrelay_upstream_response_seconds", "Seconds from sending a request upstream to its response headers.")
    }

    /// Client requests answered, by HTTP status.
    func countRequest(status: Int) { requests.count(status: status) }

    /// The request counters of one route (`route` label), with routes configured.
    func requestCounters(route: String) -> RequestCounters { RequestCounters(registry: registry, route: route) }

    /// `tokenrelay_requests_total` of one route (or of none): the hot path, counters cached per status.
    final class RequestCounters {
        private let registry: PrometheusCollectorRegistry
        private let routeLabels: [(String, String)]
        /// Indexed by the status itself (100-599): a lookup without hashing. Made on first use of each
        /// status; anything outside that range goes to `otherStatuses`.
        private var requestsByStatus = [Counter?](repeating: nil, count: 600)
        private var otherStatuses: [Int: Counter] = [:]

        init(registry: PrometheusCollectorRegistry, route: String?) {
            self.registry = registry
            routeLabels = route.map { [("route", $0)] } ?? []
        }

        func count(status: Int) {
            let indexed = requestsByStatus.indices.contains(status)
            if indexed, let counter = requestsByStatus[status] { return counter.increment() }
            if !indexed, let counter = otherStatuses[status] { return counter.increment() }
            let family = Families.requests
            let counter = registry.makeCounter(descriptor: family.descriptor, labels: [("status", String(status))] + routeLabels)
            if indexed {
                // Stored moved out and back (moves only): the look-up above, on every request, is then an access
                // the compiler proves exclusive instead of one it checks at run time.
                var counters: [Counter?] = []
                swap(&counters, &requestsByStatus)
                counters[status] = counter
                swap(&counters, &requestsByStatus)
            } else {
                otherStatuses[status] = counter
            }
            counter.increment()
        }
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
        if let histogram = holdDurations[outcome] { return histogram.record(seconds) }
        let histogram = registry.makeValueHistogram(descriptor: Families.holdDuration.descriptor, labels: [("outcome", outcome.rawValue)],
                                                    buckets: latencyBuckets)
        holdDurations[outcome] = histogram
        histogram.record(seconds)
    }

    /// Token refresh attempts, by outcome (success, rejected, transient_failure, invalid_response).
    func countRefresh(outcome: String) {
        counter(Families.refreshes, "outcome", outcome, identity: true).increment()
    }

    /// Refresh cycles started, by trigger (expiring = proactive, unauthorized, forced, …).
    func countRefreshStarted(trigger: String) {
        counter(Families.refreshCycles, "trigger", trigger, identity: true).increment()
    }

    /// Refreshes the token endpoint refused, by OAuth `error` code (`invalid_grant` means a new login).
    func countRefreshError(code: String) {
        counter(Families.refreshErrors, "error", code, identity: true).increment()
    }

    /// What the admin listener's connection limit made it do: closed_idle, closed_slow_head (408), refused (503), paused_accepting.
    func countAdminConnectionLimit(action: String) {
        counter(Families.adminConnectionLimit, "action", action).increment()
    }

    /// What `limits.max_client_connections` made us do: closed_idle, closed_slow_head (408), refused (503), paused_accepting.
    func countClientConnectionLimit(action: String) {
        counter(Families.connectionLimit, "action", action).increment()
    }

    /// Upstream requests that failed without a response, by kind (connect, timeout, tls, …).
    func countUpstreamError(kind: String) {
        counter(Families.upstreamErrors, "kind", kind).increment()
    }

    /// Tokens adopted from a shared store, by how they reached us (publish, poll, lock, conflict, reread).
    func countStoreAdoption(source: String) {
        counter(Families.storeAdoptions, "source", source, identity: true).increment()
    }

    /// Configuration reloads, by outcome: applied, invalid (the old config keeps running), needs_restart.
    func countConfigReload(outcome: String) {
        counter(Families.configReloads, "outcome", outcome).increment()
    }

    /// `identity`: a refresh or token metric, which carries the identity label when there are identities.
    private func counter(_ family: Family, _ label: String, _ value: String, identity: Bool = false) -> Counter {
        let key = "\(family.name)\u{0}\(value)"
        if let counter = labelled[key] { return counter }
        let counter = registry.makeCounter(descriptor: family.descriptor, labels: [(label, value)] + (identity ? identityLabels : []))
        labelled[key] = counter
        if identity && !identityLabels.isEmpty {
            // A retired identity's refresh in flight may still finish: it counts into a series nobody reads.
            if isRetired { registry.unregisterCounter(counter) } else { identityLabelled.append(counter) }
        }
        return counter
    }

    /// A reload removed this (named) identity: its `identity`-labelled series leave /metrics, so a
    /// dashboard does not keep showing its last gauges (login required, expiry) as if it still ran. The
    /// process-wide series it shares (held requests, replays, latency) stay.
    func retire() {
        guard !identityLabels.isEmpty, !isRetired else { return }
        isRetired = true
        for gauge in [tokenGeneration, loginRequired, unsavedTokens, accessTokenExpiresAt, secondsUntilExpiry, storeConnected, dpopEnabled] {
            registry.unregisterGauge(gauge)
        }
        for counter in [tokenFileWriteFailures, lockWaits, adoptedRotations, stormGuardTrips, storeLockAcquisitions, storeConflicts,
                        storeReadOnlyReplies, storeWritesPutBack, storeFailoversFollowed, dpopNonceReplays, dpopProofsSigned] + identityLabelled {
            registry.unregisterCounter(counter)
        }
        identityLabelled = []
        registry.unregisterValueHistogram(refreshDuration)
    }

    func countDPoPNonceReplay() { dpopNonceReplays.increment() }

    /// The key's RFC 7638 thumbprint (public: it is what the tokens' `cnf.jkt` names), as an info series.
    func recordDPoPKey(thumbprint: String) {
        dpopEnabled.record(1)
        // A key adopted at run time (`DPoPProofs.adoptKey`) replaces the series: one key is in use.
        if let previous = dpopKeyInfo { registry.unregisterGauge(previous) }
        let info = registry.makeGauge(descriptor: Family(name: "tokenrelay_dpop_key_info", help: "The DPoP key in use: its RFC 7638 thumbprint (jkt).").descriptor,
                                      labels: [("jkt", thumbprint)])
        info.record(1)
        dpopKeyInfo = info
    }
    private var dpopKeyInfo: Gauge?

    func exposition() -> String { registry.emitToString() }
}

extension Gauge {
    /// Whole numbers (counts, 0/1 flags): an integer literal would otherwise be ambiguous between the
    /// library's Int64 and Double overloads.
    func record(_ value: Int) { set(to: Double(value)) }
}
