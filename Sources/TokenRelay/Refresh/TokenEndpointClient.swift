import CLibevent
import FoundationEssentials

/// Runs one exchange with the token endpoint for the configured grant (`TokenGrantStrategy`: which
/// request, and how to read the answer).
///
/// It has its own `evhttp_connection`, so a refresh never queues behind the proxied requests it is
/// about to release, and it is not tied to any client: a client that gives up does not cancel it.
/// It never retries by itself and never switches client-authentication style, because each attempt
/// presents the refresh token, and with rotation a second presentation of a consumed token revokes the
/// whole session. Retrying is the coordinator's decision.
final class TokenEndpointClient: OutgoingRequestDelegate {
    private var endpoint: HTTPEndpoint
    private var grant: TokenGrantStrategy
    private var factory: HTTPConnectionFactory
    private var connection: OpaquePointer?
    /// Settings from a reload or a rotated client secret, waiting for the exchange in flight to end.
    private var pending: (factory: HTTPConnectionFactory, grant: TokenGrantStrategy)?
    private let retirement: ConnectionRetirement
    private var call: OutgoingRequest?
    private var response = SmallResponse()
    private var completion: ((TokenEndpointResult, _ retryAfter: Double?) -> Void)?

    init(loop: EventLoop, factory: HTTPConnectionFactory, grant: TokenGrantStrategy) {
        endpoint = factory.endpoint
        self.factory = factory
        self.grant = grant
        retirement = ConnectionRetirement(loop: loop)
        connection = Self.connect(factory)
    }

    private static func connect(_ factory: HTTPConnectionFactory) -> OpaquePointer? {
        let connection = factory.makeConnection()
        if let connection { evhttp_connection_set_max_body_size(connection, SmallResponse.maxBytes) }
        return connection
    }

    /// New token endpoint, TLS, timeout or grant (with its client secret). An exchange in flight finishes
    /// on the connection and with the request it started with; the next one uses the new settings. Never
    /// called from inside one of this client's own callbacks (a reload, a file-watch timer), so freeing
    /// the old connection here is safe.
    func reconfigure(factory: HTTPConnectionFactory, grant: TokenGrantStrategy) {
        pending = (factory, grant)
        if call == nil { applyPending() }
    }

    private func applyPending() {
        guard let pending else { return }
        self.pending = nil
        if let connection { evhttp_connection_free(connection) }
        factory = pending.factory
        endpoint = pending.factory.endpoint
        grant = pending.grant
        connection = Self.connect(pending.factory)
    }

    deinit {
        call?.cancel()
        if let connection { evhttp_connection_free(connection) }
    }

    var isBusy: Bool { call != nil }

    /// Whether the grant needs a refresh token to run at all.
    var needsRefreshToken: Bool { (pending?.grant ?? grant).needsRefreshToken }

    /// Obtains new tokens for `current` (the grant picks what it presents: refresh token, client
    /// credentials, or whatever its template names). A transient answer comes with the server's
    /// `Retry-After`, clamped (`RetryAfter`).
    ///
    /// When a request fails (timeout, lost connection) evhttp resets the connection, which closes its
    /// socket; the next exchange connects afresh. The refresh hold-off relies on that: the exchange whose
    /// outcome is unknown is closed on our side before the refresh token can leave again
    /// (`RefreshHoldOffTests` watches for the close at the token endpoint).
    func refresh(current: TokenSet, completion: @escaping (TokenEndpointResult, _ retryAfter: Double?) -> Void) {
        precondition(call == nil, "one refresh at a time")
        // Called from the coordinator's attempt (a timer or the lock's callback), never from inside the
        // previous exchange's callbacks: the old connection is free to go.
        applyPending()
        self.completion = completion
        self.response = SmallResponse()
        let prepared: TokenHTTPRequest
        switch grant.makeRequest(current: current) {
        case .success(let request): prepared = request
        case .failure(let unusable): return finish(.unusable(reason: unusable.reason))
        }
        let request = OutgoingRequest(delegate: self)
        call = request
        guard let connection else {
            return finish(.transient(reason: "could not create a connection to the token endpoint", outcomeUnknown: false))
        }
        let started = request.start(on: connection, method: prepared.method, target: prepared.target) { [endpoint] req in
            prepared.write(into: req, authority: endpoint.authority)
        }
        if !started {
            finish(.transient(reason: "could not start a request to the token endpoint", outcomeUnknown: false))
        }
    }

    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer) {
        self.response.receivedHeaders(response)
    }

    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer) {
        self.response.receivedBody(response)
    }

    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>) {
        // More bytes than the answer: the next refresh must not read them as its answer.
        if let connection, ConnectionRetirement.unreadBytes(on: connection) > 0 {
            retirement.retire(connection)
            self.connection = Self.connect(factory)
        }
        switch result {
        case .success:
            let result = grant.classify(status: response.status, body: response.body)
            var retryAfter: Double?
            if case .transient = result { retryAfter = RetryAfter.seconds(from: response.retryAfter, now: Date()) }
            finish(result, retryAfter: retryAfter)
        case .failure(let failure):
            finish(.transient(reason: "token endpoint \(failure)", outcomeUnknown: failure.mayHaveReachedPeer))
        }
    }

    private func finish(_ result: TokenEndpointResult, retryAfter: Double? = nil) {
        call = nil
        response = SmallResponse()
        let completion = self.completion
        self.completion = nil
        completion?(result, retryAfter)
    }
}
