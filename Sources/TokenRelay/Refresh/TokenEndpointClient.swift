import FoundationEssentials
import HTTPTransport

/// Where the token endpoint is and how to talk to it: what a reload or a rotated secret replaces.
struct TokenEndpointConnection {
    let endpoint: HTTPEndpoint
    /// The `refresh.tls` context, for an https endpoint only.
    let tls: TransportTLSClientContext?
    /// `timeouts.refresh_seconds`: the whole exchange, connecting included.
    let timeoutSeconds: Double
}

/// Runs one exchange with the token endpoint for the configured grant (`TokenGrantStrategy`: which
/// request, and how to read the answer).
///
/// Each exchange is an `HTTPExchange` on a connection of its own, closed when it ends: a refresh never
/// queues behind the proxied requests it is about to release, and it is not tied to any client (a client
/// that gives up does not cancel it). It never retries by itself and never switches client-authentication
/// style, because each attempt presents the refresh token, and with rotation a second presentation of a
/// consumed token revokes the whole session. Retrying is the coordinator's decision.
final class TokenEndpointClient {
    /// Largest token-endpoint answer read; a larger one fails the exchange (`response too large`).
    static let maxResponseBytes = 1 << 20

    private let eventLoop: EventLoop
    private let loop: TransportLoop
    private var connection: TokenEndpointConnection
    private var grant: TokenGrantStrategy
    /// Settings from a reload or a rotated client secret, waiting for the exchange in flight to end.
    private var pending: (connection: TokenEndpointConnection, grant: TokenGrantStrategy)?
    private var call: HTTPExchange?
    /// A request being made on a helper thread (a file read, a signature): the exchange is about to start.
    /// `deadline` ends the wait after `timeoutSeconds`; `number` tells a late result from the current one.
    private var preparation: (number: Int, startedAt: Double, deadline: LoopEvent)?
    private var preparations = 0
    private var completion: ((TokenEndpointResult, _ retryAfter: Double?) -> Void)?
    /// DPoP (`dpop`): every token request carries a proof; nil: none, and DPoP-bound answers are refused.
    var dpop: DPoPProofs?
    /// The request of the exchange in flight, kept for one resend after a DPoP nonce challenge, and when
    /// the exchange began (the resend stays within the same `refresh_seconds`).
    private var inFlight: (request: TokenHTTPRequest, input: TokenRequestInput, startedAt: Double, timeoutSeconds: Double, nonceResent: Bool)?

    init(loop: EventLoop, connection: TokenEndpointConnection, grant: TokenGrantStrategy) {
        eventLoop = loop
        self.loop = loop.transport
        self.connection = connection
        self.grant = grant
    }

    /// New token endpoint, TLS, timeout or grant (with its client secret). An exchange in flight finishes
    /// with the settings and the request it started with; the next one uses the new settings.
    func reconfigure(connection: TokenEndpointConnection, grant: TokenGrantStrategy) {
        pending = (connection, grant)
        if !isBusy { applyPending() }
    }

    private func applyPending() {
        guard let pending else { return }
        self.pending = nil
        connection = pending.connection
        grant = pending.grant
    }

    deinit {
        call?.cancel()
    }

    var isBusy: Bool { call != nil || preparation != nil }

    /// Whether the grant needs a refresh token to run at all.
    var needsRefreshToken: Bool { (pending?.grant ?? grant).needsRefreshToken }

    /// Obtains new tokens for `current` (the grant picks what it presents: refresh token, client
    /// credentials, or whatever its template names). A transient answer comes with the server's
    /// `Retry-After`, clamped (`RetryAfter`).
    ///
    /// Whatever way an exchange ends, its connection is closed before the completion runs. The refresh
    /// hold-off relies on that: the exchange whose outcome is unknown is closed on our side before the
    /// refresh token can leave again (`RefreshHoldOffTests` watches for the close at the token endpoint).
    func refresh(current: TokenSet, completion: @escaping (TokenEndpointResult, _ retryAfter: Double?) -> Void) {
        precondition(!isBusy, "one refresh at a time")
        applyPending()
        self.completion = completion
        // A refresh token bound to another DPoP key (a new dpop.key_file, or tokens adopted from a relay with
        // another key) would be refused, and presenting it with the wrong key is what a thief would do:
        // nothing is sent, and only a new login can help.
        if let dpop, let bound = current.dpopBoundThumbprint, bound != dpop.thumbprint {
            return finish(.unusable(reason: "the tokens are bound to another DPoP key (jkt \(bound), the key is jkt \(dpop.thumbprint)): run tokenrelay login"))
        }
        let input = TokenRequestInput(current)
        make(input, startedAt: EventLoop.monotonicNow, timeoutSeconds: connection.timeoutSeconds) { [unowned self] made, remaining in
            self.send(made, input: input, timeoutSeconds: remaining)
        }
    }

    /// Makes the grant's request for `input` and hands it on with the time left of `timeoutSeconds` since
    /// `startedAt`: at once when making it does not block, else on a helper thread.
    private func make(_ input: TokenRequestInput, startedAt: Double, timeoutSeconds: Double,
                      then next: @escaping (Result<TokenHTTPRequest, UnusableRequest>, _ remaining: Double) -> Void) {
        guard grant.blocksWhileMakingRequest else {
            return next(grant.makeRequest(for: input), timeoutSeconds - (EventLoop.monotonicNow - startedAt))
        }
        // Race it prevents: a signature (a millisecond and more with RSA) or a file read on the loop would
        // hold every proxied request for that long, once per refresh. The grant is an immutable value.
        preparations += 1
        let number = preparations, grant = self.grant
        let deadline = LoopEvent(loop: eventLoop) { [weak self] _ in self?.preparationTimedOut(number) }
        deadline.schedule(after: max(0, timeoutSeconds - (EventLoop.monotonicNow - startedAt)))
        preparation = (number, startedAt, deadline)
        OffLoopWork.run(on: eventLoop, { PreparedTokenRequest(result: grant.makeRequest(for: input)) }) { [weak self] prepared in
            guard let self, let preparation = self.preparation, preparation.number == number else { return }
            self.preparation = nil
            // The whole exchange stays within refresh_seconds from the moment it began (a fleet's refresh
            // lock is sized for that): the time spent preparing comes off the exchange's own timeout.
            next(prepared.result, timeoutSeconds - (EventLoop.monotonicNow - startedAt))
        }
    }

    /// A file read that hangs (a stuck network file system) must not hold the refresh forever: the cycle
    /// fails transiently with nothing sent, and the late result, if it ever comes, is dropped.
    private func preparationTimedOut(_ number: Int) {
        guard let preparation, preparation.number == number else { return }
        self.preparation = nil
        finish(.transient(reason: Self.preparationTooSlow, outcomeUnknown: false))
    }

    private static let preparationTooSlow = "preparing the token request took longer than timeouts.refresh_seconds; nothing was sent"

    private func send(_ made: Result<TokenHTTPRequest, UnusableRequest>, input: TokenRequestInput, timeoutSeconds: Double) {
        let prepared: TokenHTTPRequest
        switch made {
        case .success(let request): prepared = request
        case .failure(let unusable) where unusable.transient:
            // Nothing was sent: the refresh token (if any) is untouched, and the next attempt may succeed.
            return finish(.transient(reason: unusable.reason, outcomeUnknown: false))
        case .failure(let unusable): return finish(.unusable(reason: unusable.reason))
        }
        guard timeoutSeconds > 0 else { return finish(.transient(reason: Self.preparationTooSlow, outcomeUnknown: false)) }
        inFlight = (prepared, input, EventLoop.monotonicNow, timeoutSeconds, false)
        start(prepared, timeoutSeconds: timeoutSeconds)
    }

    private func start(_ prepared: TokenHTTPRequest, timeoutSeconds: Double) {
        var request = prepared.exchangeRequest(to: connection.endpoint, tls: connection.tls)
        if let dpop {
            // A fresh proof for every send, the resend after a nonce challenge too (a new jti, the new nonce).
            let htu = ProofSigner.htu(origin: tokenEndpointOrigin, target: Array(prepared.target.utf8))
            if let proof = dpop.proof(method: prepared.method, htu: htu, server: tokenEndpointNonceServer, accessToken: nil) {
                request.fields.append(("DPoP", proof))
            }
        }
        let limits = HTTPExchange.Limits(timeoutSeconds: timeoutSeconds, maxBodyBytes: Self.maxResponseBytes)
        call = HTTPExchange(loop: loop, request: request, limits: limits) { [weak self] result in self?.exchangeEnded(result) }
    }

    private var tokenEndpointOrigin: String { "\(connection.endpoint.scheme)://\(connection.endpoint.authority)" }

    /// The token endpoint as a DPoP server, whose nonces are kept apart from the upstreams' even at one origin
    /// (RFC 9449 §8 and §9 nonces are each the issuing server's): keyed by origin alone, an API beside the
    /// token endpoint overwrote its nonce and each refresh, then the next request, was challenged and resent.
    private var tokenEndpointNonceServer: String { "token endpoint \(tokenEndpointOrigin)" }

    /// RFC 9449 §8: `400 {"error":"use_dpop_nonce"}` with a usable `DPoP-Nonce`. The server refused the
    /// request before looking at the grant, so the refresh token it carried was not consumed: sending the
    /// same request again (once, with a fresh proof carrying the nonce) presents it only once as far as
    /// the server is concerned, and this is not an attempt whose outcome is unknown.
    private func resendsForNonce(_ response: HTTPExchange.Response, nonceAccepted: Bool) -> Bool {
        guard nonceAccepted, response.status == 400, let inFlight, !inFlight.nonceResent,
              let json = TokenEndpointJSON.parse(response.body) as? [String: Any], json["error"] as? String == "use_dpop_nonce" else { return false }
        let remaining = inFlight.timeoutSeconds - (EventLoop.monotonicNow - inFlight.startedAt)
        guard remaining > 0 else { return false }
        self.inFlight?.nonceResent = true
        dpop?.countNonceReplay()
        guard grant.blocksWhileMakingRequest else {
            start(inFlight.request, timeoutSeconds: remaining)
            return true
        }
        // A request with a client assertion (private_key_jwt, jwt_bearer) or a file's token is made anew:
        // an endpoint that remembers assertion jtis would refuse the first one again as a replay.
        call = nil
        make(inFlight.input, startedAt: inFlight.startedAt, timeoutSeconds: inFlight.timeoutSeconds) { [unowned self] made, remaining in
            switch made {
            case .success(let request) where remaining > 0:
                self.inFlight?.request = request
                self.start(request, timeoutSeconds: remaining)
            case .success: self.finish(.transient(reason: Self.preparationTooSlow, outcomeUnknown: false))
            case .failure(let unusable): self.finish(.transient(reason: unusable.reason, outcomeUnknown: false))
            }
        }
        return true
    }

    /// What the helper thread made, handed back to the loop.
    private struct PreparedTokenRequest: Sendable {
        let result: Result<TokenHTTPRequest, UnusableRequest>
    }

    private func exchangeEnded(_ result: Result<HTTPExchange.Response, HTTPExchange.Failure>) {
        switch result {
        case .success(let response):
            // §8.2: the latest nonce the token endpoint sent, on any answer, is the one for the next request.
            var nonceAccepted = false
            if let dpop, let nonce = response.field("DPoP-Nonce") {
                nonceAccepted = dpop.received(nonce: Array(nonce.utf8), from: tokenEndpointNonceServer)
            }
            if dpop != nil && resendsForNonce(response, nonceAccepted: nonceAccepted) { return }
            if dpop != nil && response.status == 400, (TokenEndpointJSON.parse(response.body) as? [String: Any])?["error"] as? String == "use_dpop_nonce" {
                // Refused before the grant was looked at: not a refusal of the refresh token (no login is
                // needed), but a nonce we could not use, or a second challenge after the resend.
                return finish(.transient(reason: "the token endpoint asked for a DPoP nonce (use_dpop_nonce) "
                                         + (nonceAccepted ? "again after the resend with its nonce" : "without a usable DPoP-Nonce"),
                                         outcomeUnknown: false))
            }
            var result = grant.classify(status: response.status, body: response.body)
            if case .granted(var granted) = result {
                if granted.proofBound {
                    if let dpop { granted.boundKeyThumbprint = dpop.thumbprint } else {
                        result = .invalidResponse(reason: TokenEndpointResult.dpopNotConfigured,
                                                  rotation: granted.refreshToken.map { .rotated(to: $0) } ?? .none)
                    }
                }
                if case .granted = result { result = .granted(granted) }
            }
            var retryAfter: Double?
            if case .transient = result { retryAfter = RetryAfter.seconds(from: response.field("Retry-After"), now: Date()) }
            finish(result, retryAfter: retryAfter)
        case .failure(let failure):
            // The failure's text names the cause (never the request, which carries the secrets).
            finish(.transient(reason: "token endpoint \(failure)", outcomeUnknown: failure.requestMayHaveReachedPeer))
        }
    }

    private func finish(_ result: TokenEndpointResult, retryAfter: Double? = nil) {
        call = nil
        inFlight = nil
        let completion = self.completion
        self.completion = nil
        completion?(result, retryAfter)
    }
}
