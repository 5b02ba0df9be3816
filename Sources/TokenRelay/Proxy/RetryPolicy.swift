import CLibevent

/// When a request that failed before any response byte may be sent once more, on a fresh connection.
///
/// The classic keep-alive race: the upstream closes an idle connection just as we send on it (its
/// keep-alive timeout, a restart). evhttp retries only connect failures, not this (docs/evhttp.md, retries).
/// Resending is safe when nothing can have been processed (the connection was never established) or
/// when processing twice is harmless by definition (idempotent methods, RFC 9110 §9.2.2). A POST or
/// PATCH whose bytes went out may have been acted on, so its failure goes to the client as a 502.
enum RetryPolicy {
    static func mayRetry(_ failure: OutgoingFailure, method: evhttp_cmd_type, sentOnReusedConnection: Bool) -> Bool {
        guard !failure.afterResponseStarted else { return false }
        switch failure.kind {
        case .connect:
            return true
        case .connectionLost:
            return sentOnReusedConnection && isIdempotent(method)
        case .connectTimeout, .timeout, .invalidResponse, .tooLarge, .tls:
            return false
        }
    }

    static func isIdempotent(_ method: evhttp_cmd_type) -> Bool {
        [EVHTTP_REQ_GET, EVHTTP_REQ_HEAD, EVHTTP_REQ_OPTIONS, EVHTTP_REQ_PUT, EVHTTP_REQ_DELETE, EVHTTP_REQ_TRACE].contains(method)
    }
}
