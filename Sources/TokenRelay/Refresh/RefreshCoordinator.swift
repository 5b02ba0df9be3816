import CLibevent
import Foundation
import Logging

/// Owns the current access token and its *generation*, and makes sure at most one refresh runs at a
/// time in this process, however many requests fail at once.
///
/// The race it prevents: N requests leave with access token A; A expires; N responses come back 401.
/// Refreshing once per 401 would present the same refresh token N times, and a server with refresh
/// token rotation treats the second presentation as theft and revokes the whole session. So:
///
/// - every forwarded request carries the generation it was sent with;
/// - a 401 for the *current* generation starts a refresh unless one is running, and the request waits;
/// - a 401 for an *older* generation is not evidence against the current token: replay at once;
/// - while a refresh runs, new requests wait instead of spending the dead token;
/// - the new tokens are written to disk *before* anyone is released (the old refresh token is already
///   burnt: if we crashed after using the new tokens but before saving them, the session would be lost);
/// - a rejected refresh latches "login required": no further refresh until the token file changes or an
///   operator asks, so a dead session never turns into a refresh storm.
///
/// Confined to the event loop thread.
final class RefreshCoordinator {
    enum State: String {
        case ready
        case refreshing
        case loginRequired = "login_required"
    }

    enum Outcome {
        case renewed(generation: UInt64)
        /// The token endpoint refused: a new login is needed.
        case rejected
        /// No new token could be obtained for now (transient failures exhausted, or an unusable answer).
        case unavailable(reason: String)
    }

    /// What a request that just got 401 should do.
    enum UnauthorizedDecision {
        case replay
        case hold
        case passThrough
    }

    /// What a request that just arrived should do.
    enum Admission {
        case send(generation: UInt64, authorization: String)
        case hold
        case loginRequired
    }

    private let loop: EventLoop
    private let endpoint: TokenEndpointClient
    private let store: TokenFile
    private let settings: Config.Refresh
    private let logger: Logger
    private let metrics: RelayMetrics
    private let redactor: SecretRedactor

    private(set) var tokens: TokenSet
    private(set) var generation: UInt64 = 1
    private(set) var state: State = .ready
    private(set) var authorizationValue: String
    private(set) var lastOutcome: (description: String, at: Date)?
    private(set) var refreshCount = 0
    private var attempt = 0
    private var retryTimer: LoopEvent?
    private var knownFileSignature: TokenFile.Signature?
    private var watchTimer: LoopEvent?

    /// Told of every refresh outcome (the proxy releases its held requests here).
    var onOutcome: ((Outcome) -> Void)?
    /// One-shot waiters, e.g. an admin `POST /refresh`.
    private var completions: [(Outcome) -> Void] = []

    init(loop: EventLoop, endpoint: TokenEndpointClient, store: TokenFile, initialTokens: TokenSet, settings: Config.Refresh,
         metrics: RelayMetrics, redactor: SecretRedactor, logger: Logger) {
        self.loop = loop
        self.endpoint = endpoint
        self.store = store
        self.tokens = initialTokens
        self.settings = settings
        self.metrics = metrics
        self.redactor = redactor
        self.logger = logger
        authorizationValue = "Bearer \(initialTokens.accessToken)"
        knownFileSignature = store.signature()
        publish()
    }

    // MARK: - Questions the proxy asks

    func admit() -> Admission {
        switch state {
        case .ready: return .send(generation: generation, authorization: authorizationValue)
        case .refreshing: return .hold
        case .loginRequired: return .loginRequired
        }
    }

    /// A request sent with `sentGeneration` came back 401 (and it was its first attempt).
    func unauthorized(sentGeneration: UInt64) -> UnauthorizedDecision {
        if state == .loginRequired { return .passThrough }
        if sentGeneration < generation { return .replay }
        startRefresh(trigger: "unauthorized")
        return .hold
    }

    /// Operator-requested refresh (`POST /refresh`): clears the latch, joins a running refresh.
    func forceRefresh(completion: @escaping (Outcome) -> Void) {
        completions.append(completion)
        if state == .loginRequired { state = .ready }
        startRefresh(trigger: "forced")
    }

    // MARK: - The refresh cycle

    private func startRefresh(trigger: String) {
        guard state != .refreshing else { return }
        state = .refreshing
        attempt = 0
        logger.info("refresh started", metadata: ["trigger": "\(trigger)", "generation": "\(generation)"])
        publish()
        attemptRefresh()
    }

    private func attemptRefresh() {
        guard let refreshToken = tokens.refreshToken else {
            logger.error("refresh impossible: the token file has no refresh_token; login required")
            metrics.countRefresh(outcome: "rejected")
            latchLoginRequired()
            return
        }
        attempt += 1
        refreshCount += 1
        endpoint.refresh(refreshToken: refreshToken) { [weak self] result in
            self?.handle(result)
        }
    }

    private func handle(_ result: TokenEndpointResult) {
        switch result {
        case .granted(let grant):
            metrics.countRefresh(outcome: "success")
            adopt(renewed(by: grant), persist: true)
            logger.info("refresh succeeded", metadata: ["generation": "\(generation)", "attempt": "\(attempt)",
                                                        "expires_at": "\(tokens.expiresAt.map(Timestamp.format) ?? "unknown")"])
            finishCycle(.renewed(generation: generation), description: "success")
        case .rejected(let status, let oauthError):
            metrics.countRefresh(outcome: "rejected")
            logger.error("refresh rejected; login required", metadata: ["status": "\(status)", "error": "\(oauthError ?? "none")"])
            latchLoginRequired()
        case .transient(let reason, let outcomeUnknown):
            metrics.countRefresh(outcome: "transient_failure")
            var metadata: Logger.Metadata = ["reason": "\(reason)", "attempt": "\(attempt)"]
            if outcomeUnknown { metadata["outcome"] = "unknown" }
            guard attempt < settings.maxAttempts else {
                logger.error("refresh failed; giving up for now", metadata: metadata)
                state = .ready
                finishCycle(.unavailable(reason: reason), description: "failed: \(reason)")
                return
            }
            let delay = settings.backoffSeconds * pow(2, Double(attempt - 1)) * Double.random(in: 0.8...1.2)
            metadata["retry_in"] = "\(String(format: "%.2f", delay))s"
            logger.warning(outcomeUnknown ? "refresh outcome unknown; retrying" : "refresh failed; retrying", metadata: metadata)
            let timer = LoopEvent(loop: loop) { [weak self] _ in self?.attemptRefresh() }
            retryTimer = timer
            timer.schedule(after: delay)
        case .invalidResponse(let reason):
            metrics.countRefresh(outcome: "invalid_response")
            logger.error("refresh failed: invalid token endpoint response", metadata: ["reason": "\(reason)"])
            state = .ready
            finishCycle(.unavailable(reason: reason), description: "invalid response: \(reason)")
        }
    }

    private func renewed(by grant: TokenGrant) -> TokenSet {
        var next = tokens
        next.accessToken = grant.accessToken
        // RFC 6749 §6: without a new refresh token in the response, the old one stays valid.
        if let refresh = grant.refreshToken { next.refreshToken = refresh }
        next.expiresAt = grant.expiresIn.map { Date(timeIntervalSinceNow: $0) }
        return next
    }

    private func latchLoginRequired() {
        state = .loginRequired
        finishCycle(.rejected, description: "rejected: login required")
    }

    private func finishCycle(_ outcome: Outcome, description: String) {
        retryTimer = nil
        lastOutcome = (description, Date())
        publish()
        onOutcome?(outcome)
        let waiting = completions
        completions = []
        waiting.forEach { $0(outcome) }
    }

    // MARK: - Token state

    /// Makes `next` the current tokens: first on disk (when they came from the token endpoint), then in
    /// memory with a new generation.
    private func adopt(_ next: TokenSet, persist: Bool) {
        redactor.update([next.accessToken, next.refreshToken])
        if persist {
            do {
                try store.write(next)
                knownFileSignature = store.signature()
            } catch {
                // The old refresh token is burnt already; the new one lives in memory only until the next
                // successful write. Loud, counted, but serving goes on.
                metrics.tokenFileWriteFailures.increment()
                logger.critical("could not persist refreshed tokens; a restart now would need a new login",
                                metadata: ["error": "\(error)"])
            }
        }
        tokens = next
        generation += 1
        authorizationValue = "Bearer \(next.accessToken)"
        state = .ready
    }

    /// Watches the token file for changes made by someone else (an operator seeding tokens after
    /// "login required", `tokenrelay token import`). A `stat` per interval is cheap and never blocks long.
    func watchTokenFile(every seconds: Double) {
        let timer = LoopEvent(loop: loop, events: Int32(EV_PERSIST)) { [weak self] _ in self?.checkTokenFile() }
        watchTimer = timer
        timer.schedule(after: seconds)
    }

    private func checkTokenFile() {
        guard state != .refreshing, let signature = store.signature(), signature != knownFileSignature else { return }
        knownFileSignature = signature
        do {
            try store.checkPermissions()
            let fromDisk = try store.load()
            guard fromDisk.accessToken != tokens.accessToken || fromDisk.refreshToken != tokens.refreshToken else { return }
            let wasLatched = state == .loginRequired
            adopt(fromDisk, persist: false)
            logger.info("adopted tokens written to the token file", metadata: ["generation": "\(generation)", "cleared_login_required": "\(wasLatched)"])
            publish()
            onOutcome?(.renewed(generation: generation))
        } catch {
            logger.error("ignoring changed token file", metadata: ["error": "\(error)"])
        }
    }

    private func publish() {
        metrics.tokenGeneration.set(to: Double(generation))
        metrics.loginRequired.set(to: state == .loginRequired ? 1 : 0)
        metrics.accessTokenExpiresAt.set(to: tokens.expiresAt?.timeIntervalSince1970 ?? 0)
    }
}
