import CLibevent
import FoundationEssentials

/// The admin listener, on its own address so that nothing on the proxied port is ever intercepted:
/// `/healthz`, `/readyz`, `/status`, `/metrics`, `POST /refresh`.
///
/// Nothing here ever writes a token or a secret: `/status` reports a state, a generation and times.
final class AdminServer {
    private let coordinator: RefreshCoordinator
    private let proxy: ProxyServer
    private let metrics: RelayMetrics
    private let startedAt = Date()
    private(set) var listener: HTTPListener!

    init(loop: EventLoop, address: ListenAddress, coordinator: RefreshCoordinator, proxy: ProxyServer, metrics: RelayMetrics) throws {
        self.coordinator = coordinator
        self.proxy = proxy
        self.metrics = metrics
        listener = try HTTPListener(loop: loop, host: address.host, port: address.port) { [unowned self] request in
            self.handle(request)
        }
        listener.setLimits(maxHeaderBytes: 16 * 1024, maxBodyBytes: 1024, timeoutSeconds: 30)
    }

    private func handle(_ request: OpaquePointer) {
        let method = evhttp_request_get_command(request)
        let path = evhttp_request_get_uri(request).map { String(cString: $0) }.map { String($0.split(separator: "?", maxSplits: 1).first ?? "") } ?? ""
        switch (method, path) {
        case (EVHTTP_REQ_GET, "/healthz"), (EVHTTP_REQ_HEAD, "/healthz"):
            respond(request, 200, json: ["status": "alive"])
        case (EVHTTP_REQ_GET, "/readyz"), (EVHTTP_REQ_HEAD, "/readyz"):
            let reason = notReadyReason()
            var body: [String: Any] = ["ready": reason == nil, "state": coordinator.state.rawValue]
            body["reason"] = reason
            let ready = reason == nil
            respond(request, ready ? 200 : 503, json: body)
        case (EVHTTP_REQ_GET, "/status"):
            respond(request, 200, json: statusReport())
        case (EVHTTP_REQ_GET, "/metrics"):
            respond(request, 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: metrics.exposition())
        case (EVHTTP_REQ_POST, "/refresh"):
            coordinator.forceRefresh { [weak self] outcome in
                guard let self else { return }
                switch outcome {
                case .renewed(let generation):
                    self.respond(request, 200, json: ["outcome": "renewed", "generation": generation])
                case .rejected:
                    self.respond(request, 409, json: ["outcome": "rejected", "state": "login_required"])
                case .unavailable(let reason):
                    self.respond(request, 503, json: ["outcome": "unavailable", "reason": reason])
                }
            }
        case (_, "/healthz"), (_, "/readyz"), (_, "/status"), (_, "/metrics"), (_, "/refresh"):
            respond(request, 405, json: ["error": "method not allowed"])
        default:
            respond(request, 404, json: ["error": "not found"])
        }
    }

    /// Why the relay is not ready, or nil: the one answer `/readyz` and `/status` both give, so the two
    /// can never disagree.
    private func notReadyReason() -> String? {
        switch coordinator.state {
        case _ where proxy.isDraining: "shutting down"
        case .loginRequired: "login required"
        case .degraded: "storm guard: \(coordinator.degradedReason ?? "too many refreshes")"
        default: unusableTokenReason()
        }
    }

    /// Why requests cannot succeed with the token in hand although nothing is latched: they would only
    /// get 503 (or wait for a refresh), so the sidecar is not ready. A refresh that failed while the token
    /// still works is no reason.
    private func unusableTokenReason() -> String? {
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
        let notReady = notReadyReason()
        var report: [String: Any] = [
            "state": coordinator.state.rawValue,
            "ready": notReady == nil,
            "not_ready_reason": notReady ?? JSONNull(),
            "generation": coordinator.generation,
            "expires_at": coordinator.expiresAt.map(Timestamp.format) ?? JSONNull(),
            "degraded_reason": coordinator.degradedReason ?? notReady ?? JSONNull(),
            "has_refresh_token": coordinator.tokens.refreshToken != nil,
            "unsaved_tokens": coordinator.unsavedTokens != nil,
            "refresh_hold_off": coordinator.refreshHoldOffReason ?? JSONNull(),
            "refresh_attempts": coordinator.refreshCount,
            "held_requests": proxy.heldCount,
            "active_requests": proxy.activeCount,
            "upstream_waiters": proxy.upstreamWaiterCount,
            "client_connections": proxy.clientConnectionCount,
            "draining": proxy.isDraining,
            "started_at": Timestamp.format(startedAt),
        ]
        report["token_store"] = coordinator.storeStatus
        if let last = coordinator.lastOutcome {
            report["last_refresh"] = ["outcome": last.description, "at": Timestamp.format(last.at)]
        }
        return report
    }

    private func respond(_ request: OpaquePointer, _ status: Int32, json: [String: Any]) {
        let data = (try? JSONWriter.data(json, options: [.sortedKeys])) ?? Array("{}".utf8)
        respond(request, status, contentType: "application/json", body: String(decoding: data, as: UTF8.self) + "\n")
    }

    private func respond(_ request: OpaquePointer, _ status: Int32, contentType: String, body: String) {
        let headers = HeaderList(raw: evhttp_request_get_output_headers(request))
        headers.add("Content-Type", contentType)
        headers.add("Cache-Control", "no-store")
        let buffer = evbuffer_new()!
        EvBuffer.append(buffer, body)
        evhttp_send_reply(request, status, Self.reasonPhrase(status), buffer)
        evbuffer_free(buffer)
    }

    private static func reasonPhrase(_ status: Int32) -> String {
        switch status {
        case 200: return "OK"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 409: return "Conflict"
        default: return "Service Unavailable"
        }
    }
}
