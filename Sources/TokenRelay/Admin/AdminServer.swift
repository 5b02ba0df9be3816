import FoundationEssentials
import HTTPTransport
import HTTPWire

/// The admin listener, on its own address so that nothing on the proxied port is ever intercepted:
/// `/healthz`, `/readyz`, `/status`, `/metrics`, `POST /refresh`.
///
/// Nothing here ever writes a token or a secret: `/status` reports a state, a generation and times.
final class AdminServer {
    /// The top-level identity's; nil without one (then `/refresh` must name an identity).
    private let coordinator: RefreshCoordinator?
    /// `identities` by name, in config order (each reported and probed beside the top-level one).
    /// Replaced by a reload that adds or removes identities (`use`).
    private var identities: [(name: String, coordinator: RefreshCoordinator)]
    private let proxy: ProxyServer
    private let metrics: RelayMetrics
    private let startedAt = Date()
    /// With `admin.token_file`: what `POST /refresh` and `/status` require. The probes and `/metrics`
    /// stay open (a kubelet or a scraper carries no token).
    /// Replaced when `admin.token_file` changes (`Relay.watchAdminToken`).
    var bearerToken: AdminBearerToken?
    private(set) var listener: SmallHTTPServer!

    /// Requests here are a probe or a scrape: small heads, tiny bodies, and a client that sends its
    /// request the moment it connects. So a connection that says nothing, or trickles its head, gives way
    /// at once to a newcomer at the limit, and nothing may sit idle for long: the port is often bound to
    /// the pod network for the kubelet, and a flood of idle connections there must not time out the
    /// liveness probe (a restart loop).
    static let limits = SmallHTTPServer.Limits(maxHeadBytes: 16 * 1024, maxBodyBytes: 1024, timeoutSeconds: 5, maxConnections: 32,
                                               evictsQuietAtOnce: true)
    /// Descriptors the admin port can hold: its limit and the connections allowed to wait over it.
    static var maxDescriptors: Int { HTTPServer.Settings(maxConnections: limits.maxConnections).effectiveOverLimitAllowance + limits.maxConnections }

    init(loop: EventLoop, address: ListenAddress, coordinator: RefreshCoordinator?, identities: [NamedIdentity] = [], proxy: ProxyServer,
         metrics: RelayMetrics, bearerToken: AdminBearerToken? = nil) throws {
        self.bearerToken = bearerToken
        self.coordinator = coordinator
        self.identities = identities.map { ($0.name, $0.coordinator) }
        self.proxy = proxy
        self.metrics = metrics
        listener = try SmallHTTPServer(loop: loop, host: address.host, port: address.port, limits: Self.limits) { [unowned self] request, responder in
            self.handle(request, responder)
        }
        listener.onLimitEvent = { [unowned metrics] event in
            switch event {
            case .refused: metrics.countAdminConnectionLimit(action: "refused")
            case .closedIdle: metrics.countAdminConnectionLimit(action: "closed_idle")
            case .closedStalledHead: metrics.countAdminConnectionLimit(action: "closed_slow_head")
            case .pausedAccepting: metrics.countAdminConnectionLimit(action: "paused_accepting")
            case .acceptedOverLimit: break
            }
        }
    }

    /// The identities after a reload.
    func use(_ identities: [NamedIdentity]) {
        self.identities = identities.map { ($0.name, $0.coordinator) }
    }

    private func handle(_ request: SmallRequest, _ responder: SmallResponder) {
        // `/readyz/NAME` is `/readyz?identity=NAME`.
        var path = request.path
        var identityName = Self.queryValue("identity", in: request.target)
        if path.hasPrefix("/readyz/"), identityName == nil {
            identityName = String(path.dropFirst("/readyz/".count))
            path = "/readyz"
        }
        if let bearerToken, path == "/status" || path == "/refresh", !bearerToken.accepts(request.field("authorization")) {
            return respond(responder, 401, json: ["error": "unauthorized"],
                           extraFields: [("WWW-Authenticate", "Bearer realm=\"tokenrelay-admin\"")])
        }
        // After the token check: an unauthenticated caller learns nothing about which identities exist.
        var chosen = coordinator
        if let identityName, ["/readyz", "/refresh"].contains(path) {
            guard let found = identities.first(where: { $0.name == identityName }) else {
                return respond(responder, 404, json: ["error": "no identity of that name"])
            }
            chosen = found.coordinator
        }
        if chosen == nil, request.method == .post, path == "/refresh" {
            // No top-level identity to refresh: which one is meant must be said.
            return respond(responder, 400, json: ["error": "identity_required",
                                                  "reason": "this config has no top-level identity; name one with ?identity=NAME (identities: "
                                                      + identities.map(\.name).joined(separator: ", ") + ")"])
        }
        switch (request.method, path) {
        case (.get, "/healthz"), (.head, "/healthz"):
            respond(responder, 200, json: ["status": "alive"])
        case (.get, "/readyz"), (.head, "/readyz"):
            let reason = identityName == nil ? notReadyReasonOfAll() : chosen.flatMap(notReadyReason)
            var body: [String: Any] = ["ready": reason == nil]
            // Without a top-level identity, a probe of the whole relay has no one state: each identity's is listed.
            body["state"] = chosen?.state.rawValue
            body["reason"] = reason
            if identityName == nil, !identities.isEmpty {
                body["identities"] = Dictionary(uniqueKeysWithValues: identities.map { named in
                    let reason = notReadyReason(named.coordinator)
                    return (named.name, ["ready": reason == nil, "state": named.coordinator.state.rawValue, "reason": reason ?? JSONNull()] as [String: Any])
                })
            }
            let ready = reason == nil
            respond(responder, ready ? 200 : 503, json: body)
        case (.get, "/status"):
            respond(responder, 200, json: statusReport())
        case (.get, "/metrics"):
            respond(responder, 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: metrics.exposition())
        case (.post, "/refresh"):
            chosen?.forceRefresh { [weak self] outcome in
                guard let self else { return }
                switch outcome {
                case .renewed(let generation):
                    self.respond(responder, 200, json: ["outcome": "renewed", "generation": generation])
                case .rejected:
                    self.respond(responder, 409, json: ["outcome": "rejected", "state": "login_required"])
                case .unavailable(let reason):
                    self.respond(responder, 503, json: ["outcome": "unavailable", "reason": reason])
                }
            }
        case (_, "/healthz"), (_, "/readyz"), (_, "/status"), (_, "/metrics"), (_, "/refresh"):
            respond(responder, 405, json: ["error": "method not allowed"])
        default:
            respond(responder, 404, json: ["error": "not found"])
        }
    }

    /// The value of `name` in the target's query, if any (identity names need no decoding: the config
    /// allows letters, digits, `.`, `_` and `-` only).
    private static func queryValue(_ name: String, in target: String) -> String? {
        guard let query = target.split(separator: "?", maxSplits: 1).dropFirst().first else { return nil }
        for pair in query.split(separator: "&") where pair.hasPrefix("\(name)=") {
            return String(pair.dropFirst(name.count + 1))
        }
        return nil
    }

    /// Ready when every identity is: the first reason found, naming its identity.
    private func notReadyReasonOfAll() -> String? {
        if let coordinator, let reason = notReadyReason(coordinator) { return reason }
        for named in identities {
            if let reason = notReadyReason(named.coordinator) { return "identity \(named.name): \(reason)" }
        }
        return nil
    }

    /// Why the relay is not ready, or nil: the one answer `/readyz` and `/status` both give, so the two
    /// can never disagree.
    private func notReadyReason(_ coordinator: RefreshCoordinator) -> String? {
        switch coordinator.state {
        case _ where proxy.isDraining: "shutting down"
        case .loginRequired: coordinator.clientAuthenticationRefused ? "client authentication refused" : "login required"
        case .degraded: "storm guard: \(coordinator.degradedReason ?? "too many refreshes")"
        case _ where coordinator.storeNotWritableReason != nil: "token store not writable (\(coordinator.storeNotWritableReason ?? ""))"
        default: unusableTokenReason(coordinator)
        }
    }

    /// Why requests cannot succeed with the token in hand although nothing is latched: they would only
    /// get 503 (or wait for a refresh), so the sidecar is not ready. A refresh that failed while the token
    /// still works is no reason.
    private func unusableTokenReason(_ coordinator: RefreshCoordinator) -> String? {
        let reason: String
        if coordinator.tokens.accessToken.isEmpty {
            reason = "no access token yet"
        } else if let expiresAt = coordinator.expiresAt, expiresAt <= Date() {
            reason = "access token expired"
        } else if coordinator.isAccessTokenKnownDead {
            reason = "access token rejected by the upstream and the refresh failed"
        } else {
            return nil
        }
        if let outage = coordinator.storeOutage { return "\(reason); token store unreachable (\(outage)): no relay refreshes without it" }
        guard let holdOff = coordinator.refreshHoldOffReason else { return reason }
        return "\(reason); \(holdOff)"
    }

    private func statusReport() -> [String: Any] {
        // Without a top-level identity: the listener's figures and the identities, nothing of an identity at the top.
        var report = coordinator.map(identityReport) ?? processReport()
        report["ready"] = notReadyReasonOfAll() == nil
        report["held_requests"] = proxy.heldCount
        if !proxy.config.routes.isEmpty {
            // Each route's share of limits.max_held_requests is derived from the config: shown so an operator sees it.
            report["routes"] = Dictionary(uniqueKeysWithValues: proxy.heldByRoute.map {
                ($0.route, ["held_requests": $0.held, "max_held_requests": $0.limit])
            })
        }
        if !identities.isEmpty {
            report["identities"] = Dictionary(uniqueKeysWithValues: identities.map { ($0.name, identityReport($0.coordinator)) })
        }
        return report
    }

    /// One identity's part of `/status`, and with the listener's figures, the whole of it for the top-level one.
    private func identityReport(_ coordinator: RefreshCoordinator) -> [String: Any] {
        let notReady = notReadyReason(coordinator)
        var report: [String: Any] = [
            "state": coordinator.state.rawValue,
            "ready": notReady == nil,
            "not_ready_reason": notReady ?? JSONNull(),
            "generation": coordinator.generation,
            "expires_at": coordinator.expiresAt.map(Timestamp.format) ?? JSONNull(),
            "degraded_reason": coordinator.degradedReason ?? notReady ?? JSONNull(),
            "has_refresh_token": coordinator.tokens.refreshToken != nil,
            "dpop": coordinator.dpop?.statusReport ?? ["enabled": false],
            "unsaved_tokens": coordinator.unsavedTokens != nil,
            "refresh_hold_off": coordinator.refreshHoldOffReason ?? JSONNull(),
            "refresh_attempts": coordinator.refreshCount,
            "held_requests": proxy.heldCount(of: coordinator),
        ]
        report.merge(processReport()) { identity, _ in identity }
        report["token_store"] = coordinator.storeStatus
        if let last = coordinator.lastOutcome {
            report["last_refresh"] = ["outcome": last.description, "at": Timestamp.format(last.at)]
        }
        return report
    }

    /// The process's own figures (the listener, the drain), the same for every identity.
    private func processReport() -> [String: Any] {
        ["active_requests": proxy.activeCount, "upstream_waiters": proxy.upstreamWaiterCount, "client_connections": proxy.clientConnectionCount,
         "draining": proxy.isDraining, "started_at": Timestamp.format(startedAt)]
    }

    private func respond(_ responder: SmallResponder, _ status: Int, json: [String: Any], extraFields: [(name: String, value: String)] = []) {
        let data = (try? JSONWriter.data(json, options: [.sortedKeys])) ?? Array("{}".utf8)
        respond(responder, status, contentType: "application/json", body: String(decoding: data, as: UTF8.self) + "\n", extraFields: extraFields)
    }

    private func respond(_ responder: SmallResponder, _ status: Int, contentType: String, body: String,
                         extraFields: [(name: String, value: String)] = []) {
        responder.respond(status: status, reason: Self.reasonPhrase(status),
                          fields: [("Content-Type", contentType), ("Cache-Control", "no-store")] + extraFields, body: Array(body.utf8))
    }

    private static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 409: return "Conflict"
        default: return "Service Unavailable"
        }
    }
}
