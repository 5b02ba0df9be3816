import CLibevent
import Foundation
import Logging

/// Owns the current access token and its *generation*, and makes sure at most one refresh runs at a
/// time, in this process and across processes sharing the token file, however many requests fail at once.
///
/// The race it prevents: N requests leave with access token A; A expires; N responses come back 401.
/// Refreshing once per 401 would present the same refresh token N times, and a server with refresh
/// token rotation treats the second presentation as theft and revokes the whole session. So:
///
/// - every forwarded request carries the generation it was sent with;
/// - a 401 for the *current* generation starts a refresh unless one is running, and the request waits;
/// - a 401 for an *older* generation is not evidence against the current token: replay at once;
/// - while a 401-triggered (reactive) refresh runs, new requests wait instead of spending the dead
///   token; during a proactive refresh (the token is still valid) they keep flowing;
/// - each attempt holds an advisory lock on the token file and first re-reads it: if another process
///   has rotated the tokens already, they are adopted instead of presenting a burnt refresh token;
/// - new tokens are written to disk *before* anyone is released (the old refresh token is already
///   burnt: losing the new one in a crash would lose the session). The write with its fsync runs on a
///   helper thread while the cycle stays open, so held requests stay held and slow storage never
///   stalls the requests still flowing;
/// - a rejected refresh latches "login required", and too many 401-triggered refreshes in a window
///   trip the storm guard: either way no refresh storm.
///
/// Confined to the event loop thread.
final class RefreshCoordinator {
    enum State: String {
        case ready
        case refreshing
        case loginRequired = "login_required"
        /// The storm guard stopped refreshing for a while; 401s pass through.
        case degraded
    }

    enum Mode: String {
        /// Ahead of expiry: the current token still works, requests are not held.
        case proactive
        /// The upstream said the token is dead: new requests wait for the new one.
        case reactive
    }

    enum Outcome {
        case renewed(generation: UInt64)
        /// The token endpoint refused: a new login is needed.
        case rejected
        /// No new token could be obtained for now (transient failures exhausted, or an unusable answer).
        case unavailable(reason: String)
    }

    /// What a request that just got a refresh-triggering status should do.
    enum UnauthorizedDecision {
        case replay
        case hold
        case passThrough
        /// No refresh may start now (the refresh hold-off): 503 with this `Retry-After`.
        case unavailable(retryAfter: Int)
    }

    /// What a request that just arrived should do.
    enum Admission {
        case send(generation: UInt64, authorization: String)
        case hold
        case loginRequired
        /// The access token is dead and no refresh may start now (the refresh hold-off).
        case unavailable(retryAfter: Int)
    }

    private let loop: EventLoop
    private let endpoint: TokenEndpointClient
    private let store: TokenFile
    private let lock: TokenFileLock
    private var settings: Config.Refresh
    private var injection: InjectSettings
    /// Settings from a reload during a cycle: that cycle finishes with the ones it started with.
    private var pendingSettings: Config.Refresh?
    private let lockTimeout: Double
    /// `timeouts.refresh_seconds`: how long one exchange may take, and so how long after sending a
    /// refresh request the server may still be working on it.
    private let refreshTimeout: Double
    private let logger: Logger
    private let metrics: RelayMetrics
    private let redactor: SecretRedactor

    private(set) var tokens: TokenSet
    private(set) var generation: UInt64 = 1
    private(set) var state: State = .ready
    private(set) var mode: Mode = .reactive
    private(set) var authorizationValue: String
    private(set) var lastOutcome: (description: String, at: Date)?
    private(set) var refreshCount = 0
    /// Why the storm guard paused refreshing.
    private var stormReason: String?
    private var lifetime: Double?
    private var attempt = 0
    private var countsTowardsStormGuard = false
    /// Set at shutdown: no new cycle or retry starts; one already talking to the token endpoint finishes,
    /// because its answer may carry the only copy of a rotated refresh token.
    private var stopped = false
    /// Called when an exchange with the token endpoint ends and its tokens are saved (graceful shutdown
    /// waits for it).
    var onTokenEndpointIdle: (() -> Void)?
    /// Renewed tokens are being written to the token file.
    private var persisting = false
    /// The token endpoint may have rotated the refresh token without us seeing the new one (a timeout
    /// after the request went out, an unreadable 2xx). Presenting it again would look like theft to a
    /// rotation server if it did. So until new tokens arrive, the refresh token is presented only once
    /// the access token is actually needed (a 401, or its expiry), never early by the proactive timer.
    private var refreshTokenInDoubt = false
    /// When the last cycle started (monotonic): time-triggered cycles are spaced by `minimumCycleSpacing`.
    private var lastCycleStartedAt = -Double.infinity
    /// A token endpoint that hands out tokens due at once (a lifetime of a fraction of a second) must
    /// not turn the proactive timer into a refresh loop.
    static let minimumCycleSpacing = 1.0
    private var retryTimer: LoopEvent?
    private var proactiveTimer: LoopEvent?
    private var recoveryTimer: LoopEvent?
    private var reactiveRefreshTimes: [Double] = []
    /// The refresh hold-off (rule: after an unknown outcome no refresh token leaves until that exchange
    /// cannot still be in progress at the server). `until` is monotonic; `unknownOutcomes` counts
    /// unknown outcomes in a row for the exponential part.
    private var holdOff: (until: Double, reason: String)?
    private var unknownOutcomes = 0
    private var holdOffTimer: LoopEvent?
    /// When the request of the current attempt left (monotonic).
    private var attemptSentAt = 0.0
    /// The token endpoint's last `Retry-After`, as a monotonic time before which no attempt starts (this
    /// cycle's retries and the next cycle's first attempt alike).
    private var notBefore = -Double.infinity
    /// Tokens in service that could not be written to the token file (rotated ones: the file holds a
    /// burnt refresh token). Retried with backoff until a write succeeds; a last try at exit.
    private(set) var unsavedTokens: (error: String, failedWrites: Int)?
    private var saveRetryTimer: LoopEvent?
    /// Refresh tokens this process has presented: never adopt one of them from disk again.
    private var spentRefreshTokens: [String] = []
    private var knownFileSignature: TokenFile.Signature?
    private var watchTimer: LoopEvent?
    /// The generation the upstream last refused, and the one whose cycle after such a refusal ended
    /// without new tokens (`isAccessTokenKnownDead`).
    private var refusedGeneration: UInt64?
    private var deadGeneration: UInt64?

    /// Told of every refresh outcome (the proxy releases its held requests here).
    var onOutcome: ((Outcome) -> Void)?
    /// One-shot waiters, e.g. an admin `POST /refresh`.
    private var completions: [(Outcome) -> Void] = []

    init(loop: EventLoop, endpoint: TokenEndpointClient, store: TokenFile, lock: TokenFileLock, initialTokens: TokenSet,
         settings: Config.Refresh, injection: InjectSettings = InjectSettings(), lockTimeout: Double, refreshTimeout: Double = 60,
         metrics: RelayMetrics, redactor: SecretRedactor, logger: Logger) {
        self.loop = loop
        self.endpoint = endpoint
        self.store = store
        self.lock = lock
        self.settings = settings
        self.injection = injection
        self.lockTimeout = lockTimeout
        self.refreshTimeout = refreshTimeout
        self.metrics = metrics
        self.redactor = redactor
        self.logger = logger
        (tokens, lifetime) = Self.withStoredExpiry(initialTokens)
        authorizationValue = injection.value(for: initialTokens.accessToken)
        knownFileSignature = store.signature()
        publish()
    }

    /// Starts the timers: proactive refresh (at once if the stored token is already due) and the token
    /// file watch.
    func start(watchInterval: Double) {
        scheduleProactiveRefresh()
        if tokens.accessToken.isEmpty { startRefresh(mode: .reactive, trigger: "no_token") }
        let timer = LoopEvent(loop: loop, events: Int32(EV_PERSIST)) { [weak self] _ in
            self?.checkTokenFile()
            self?.publish()
        }
        watchTimer = timer
        timer.schedule(after: watchInterval)
    }

    /// A reload: refresh settings (attempts, backoff, proactive timing, storm guard) from the next cycle
    /// on, so a cycle under way finishes with the ones it started with; the injection format at once
    /// (same token, written differently). The token endpoint and grant are the endpoint client's.
    func apply(settings: Config.Refresh, injection: InjectSettings) {
        self.injection = injection
        authorizationValue = injection.value(for: tokens.accessToken)
        guard state != .refreshing else { return pendingSettings = settings }
        self.settings = settings
        scheduleProactiveRefresh()
    }

    // MARK: - Questions the proxy asks

    func admit() -> Admission {
        if let retryAfter = holdOffRetryAfter(), accessTokenNeedsReplacing { return .unavailable(retryAfter: retryAfter) }
        // No token yet (a grant that fetches its own, whose first fetch failed): fetch one, hold meanwhile.
        if tokens.accessToken.isEmpty && state == .ready { startRefresh(mode: .reactive, trigger: "no_token") }
        switch state {
        case .ready, .degraded: return .send(generation: generation, authorization: authorizationValue)
        case .refreshing where mode == .proactive: return .send(generation: generation, authorization: authorizationValue)
        case .refreshing: return .hold
        case .loginRequired: return .loginRequired
        }
    }

    /// A request sent with `sentGeneration` came back with a refresh-triggering status (its first send).
    func unauthorized(sentGeneration: UInt64) -> UnauthorizedDecision {
        if state == .loginRequired || state == .degraded { return .passThrough }
        if sentGeneration < generation { return .replay }
        refusedGeneration = generation
        if let retryAfter = holdOffRetryAfter() {
            deadGeneration = generation
            return .unavailable(retryAfter: retryAfter)
        }
        if state == .refreshing {
            if mode == .proactive {
                // The token died before the proactive refresh finished: from now on requests wait.
                mode = .reactive
                logger.info("access token rejected during a proactive refresh; holding requests until it completes")
            }
            return .hold
        }
        guard stormGuardAllowsRefresh() else { return .passThrough }
        startRefresh(mode: .reactive, trigger: "unauthorized")
        return .hold
    }

    /// Operator-requested refresh (`POST /refresh`): clears the latch and the storm guard, joins a
    /// running refresh.
    func forceRefresh(completion: @escaping (Outcome) -> Void) {
        // Not even an operator may lift the hold-off: presenting the refresh token now is the very
        // reuse it prevents.
        if let holdOff, state != .refreshing {
            return completion(.unavailable(reason: holdOff.reason))
        }
        completions.append(completion)
        if state == .loginRequired || state == .degraded { clearLatches() }
        startRefresh(mode: .reactive, trigger: "forced")
    }

    var expiresAt: Date? { tokens.expiresAt }

    /// The upstream refused the current access token and a refresh cycle since then ended without new
    /// tokens: every request can only fail until a refresh succeeds or tokens are adopted, both of which
    /// start a new generation. A failed refresh of a token nobody refused says nothing about the token.
    var isAccessTokenKnownDead: Bool { deadGeneration == generation }

    /// No access token, or one known dead or past its expiry: requests can only succeed with new tokens.
    private var accessTokenNeedsReplacing: Bool {
        tokens.accessToken.isEmpty || isAccessTokenKnownDead || (tokens.expiresAt.map { $0 <= Date() } ?? false)
    }

    /// What /status and /readyz report besides the state: the storm guard's reason, the refresh
    /// hold-off, tokens that could not be saved.
    var degradedReason: String? {
        stormReason ?? holdOff.map { $0.reason } ?? unsavedTokens.map { "rotated tokens are not saved in the token file: \($0.error)" }
    }

    /// The refresh hold-off's reason while it lasts (requests that need new tokens get 503 meanwhile).
    var refreshHoldOffReason: String? { holdOff?.reason }

    /// Seconds until the hold-off ends, rounded up for `Retry-After`, or nil when there is none.
    private func holdOffRetryAfter() -> Int? {
        guard let holdOff else { return nil }
        let remaining = holdOff.until - EventLoop.monotonicNow
        guard remaining > 0 else { return nil }
        return Int(min(remaining, 3600).rounded(.up))
    }

    // MARK: - The refresh cycle

    /// Whether an exchange with the token endpoint is under way, or its answer is still being saved: in
    /// both cases the process holds the only copy of a rotated refresh token.
    var isTalkingToTokenEndpoint: Bool { endpoint.isBusy || persisting }

    /// Graceful shutdown: no new refresh cycles or retries from now on.
    func stopRefreshing() {
        stopped = true
        proactiveTimer = nil
    }

    private func startRefresh(mode: Mode, trigger: String) {
        guard !stopped, holdOff == nil else { return }
        if state == .refreshing {
            if mode == .reactive { self.mode = .reactive }
            return
        }
        state = .refreshing
        self.mode = mode
        lastCycleStartedAt = EventLoop.monotonicNow
        countsTowardsStormGuard = trigger == "unauthorized"
        attempt = 0
        proactiveTimer = nil
        metrics.countRefreshStarted(trigger: trigger)
        logger.info("refresh started", metadata: ["trigger": "\(trigger)", "mode": "\(mode.rawValue)", "generation": "\(generation)"])
        publish()
        // The first attempt runs on the next loop pass, never inside this call: the request whose 401
        // started the cycle must have joined the held list before a cycle that ends at once (tokens
        // adopted from disk, no refresh token) releases it.
        // A Retry-After from the last cycle still holds (rule: a server that asked for a pause gets it,
        // however many 401s arrive meanwhile); the cycle is open and requests wait in it.
        let kickoff = LoopEvent(loop: loop) { [weak self] _ in self?.runAttempt() }
        retryTimer = kickoff
        kickoff.schedule(after: max(0, notBefore - EventLoop.monotonicNow))
    }

    /// One attempt: take the cross-process lock, adopt tokens another process wrote meanwhile, or else
    /// present the refresh token. The lock is held until the result is on disk.
    private func runAttempt() {
        lock.acquire(timeout: lockTimeout) { [weak self] acquired, waited in
            guard let self else { return }
            if waited { self.metrics.lockWaits.increment() }
            guard acquired else {
                self.attempt += 1  // counts, or another process holding the lock would keep this cycle alive forever
                return self.handle(.transient(reason: "timed out waiting for the token file lock \(self.lock.path)", outcomeUnknown: false), retryAfter: 0)
            }
            if let onDisk = try? self.newTokensOnDisk() {
                self.adoptFromDisk(onDisk, reason: "adopted tokens rotated by another process")
                self.lock.release()
                return self.finishCycle(.renewed(generation: self.generation), description: "adopted from token file")
            }
            if self.endpoint.needsRefreshToken && self.tokens.refreshToken == nil {
                return self.reject("refresh impossible: the token file has no refresh_token; login required")
            }
            if self.attempt == 0 && self.countsTowardsStormGuard { self.reactiveRefreshTimes.append(EventLoop.monotonicNow) }
            self.attempt += 1
            self.refreshCount += 1
            if self.endpoint.needsRefreshToken, let refreshToken = self.tokens.refreshToken {
                self.spentRefreshTokens = Array((self.spentRefreshTokens + [refreshToken]).suffix(16))
            }
            let started = EventLoop.monotonicNow
            self.attemptSentAt = started
            self.endpoint.refresh(current: self.tokens) { [weak self] result, retryAfter in
                self?.metrics.refreshDuration.record(EventLoop.monotonicNow - started)
                if let retryAfter { self?.notBefore = EventLoop.monotonicNow + retryAfter }
                self?.handle(result, retryAfter: retryAfter ?? 0)
                self?.onTokenEndpointIdle?()
            }
        }
    }

    /// Tokens in the token file that this process has not seen (another process rotated them, an
    /// operator seeded them), or nil. The file must be private and well-formed, as at start.
    private func newTokensOnDisk() throws -> TokenSet? {
        try store.checkPermissions()
        let onDisk = try store.load()
        return isNewToUs(onDisk) ? onDisk : nil
    }

    private func adoptFromDisk(_ onDisk: TokenSet, reason: String) {
        knownFileSignature = store.signature()
        let previous = state
        let (next, lifetime) = Self.withStoredExpiry(onDisk)
        adopt(next, lifetime: lifetime)
        metrics.adoptedRotations.increment()
        logger.info("\(reason)", metadata: ["generation": "\(generation)", "previous_state": "\(previous.rawValue)"])
    }

    private func isNewToUs(_ candidate: TokenSet) -> Bool {
        let changed = candidate.accessToken != tokens.accessToken || candidate.refreshToken != tokens.refreshToken
        let spent = candidate.refreshToken.map { spentRefreshTokens.contains($0) } ?? false
        return changed && !spent
    }

    private func handle(_ result: TokenEndpointResult, retryAfter: Double) {
        switch result {
        case .granted(let grant):
            metrics.countRefresh(outcome: "success")
            let (next, lifetime) = tokens.renewed(by: grant, now: Date())
            redactor.update([next.accessToken, next.refreshToken])
            for warning in grant.warnings { logger.warning("token endpoint answer: \(warning)") }
            persist(next) { [weak self] in
                guard let self else { return }
                self.adopt(next, lifetime: lifetime)
                self.lock.release()
                self.logger.info("refresh succeeded", metadata: ["generation": "\(self.generation)", "attempt": "\(self.attempt)",
                                                                 "expires_at": "\(self.tokens.expiresAt.map(Timestamp.format) ?? "unknown")"])
                self.finishCycle(.renewed(generation: self.generation), description: "success")
            }
        case .rejected(let status, let oauthError):
            metrics.countRefreshError(code: oauthError ?? "http_\(status)")
            reject("refresh rejected; login required", metadata: ["status": "\(status)", "error": "\(oauthError ?? "none")"])
        case .transient(let reason, let outcomeUnknown):
            lock.release()
            metrics.countRefresh(outcome: "transient_failure")
            var metadata: Logger.Metadata = ["reason": "\(reason)", "attempt": "\(attempt)"]
            if outcomeUnknown { metadata["outcome"] = "unknown" }
            if outcomeUnknown && endpoint.needsRefreshToken {
                // The server may have rotated the refresh token and we never saw the answer. Presenting it
                // again while that request may still be queued at a paused server is how a rotation server
                // concludes theft. End the cycle and hold off (`startHoldOff`).
                refreshTokenInDoubt = true
                startHoldOff(reason: reason)
                metadata["hold_off_seconds"] = "\(String(format: "%.2f", (holdOff?.until ?? 0) - EventLoop.monotonicNow))"
                logger.error("refresh outcome unknown; not retrying now (the refresh token may already be rotated)",
                             metadata: metadata)
                return giveUp(reason: "refresh outcome unknown (\(reason)); the refresh token is not presented again for now")
            }
            guard attempt < settings.maxAttempts, !stopped else {
                logger.error("refresh failed; giving up for now", metadata: metadata)
                return giveUp(reason: reason)
            }
            // The server's Retry-After wins over a shorter backoff (rule: no retry storm against a token
            // endpoint that said how long it needs).
            let backoff = settings.backoffSeconds * pow(2, Double(min(max(0, attempt - 1), 20))) * Double.random(in: 0.8...1.2)
            let delay = max(backoff, retryAfter)
            metadata["retry_in"] = "\(String(format: "%.2f", delay))s"
            logger.warning(outcomeUnknown ? "refresh outcome unknown; retrying" : "refresh failed; retrying", metadata: metadata)
            let timer = LoopEvent(loop: loop) { [weak self] _ in self?.runAttempt() }
            retryTimer = timer
            timer.schedule(after: delay)
        case .unusable(let reason):
            reject("refresh impossible; login required", metadata: ["reason": "\(reason)"])
        case .invalidResponse(let reason, let rotation):
            metrics.countRefresh(outcome: "invalid_response")
            logger.error("refresh failed: invalid token endpoint response", metadata: ["reason": "\(reason)"])
            switch rotation {
            case .rotated(let refreshToken) where endpoint.needsRefreshToken:
                return keepRotatedRefreshToken(refreshToken, reason: reason)
            case .unknown where endpoint.needsRefreshToken:
                refreshTokenInDoubt = true
                startHoldOff(reason: reason)
            default:
                break
            }
            lock.release()
            giveUp(reason: reason)
        }
    }

    /// An answer with an unusable access token but a new refresh token: the old refresh token is burnt,
    /// so the new one is saved (and used next time) while the current access token stays in service.
    private func keepRotatedRefreshToken(_ refreshToken: String, reason: String) {
        var kept = tokens
        kept.refreshToken = refreshToken
        redactor.update([kept.accessToken, refreshToken])
        persist(kept) { [weak self] in
            guard let self else { return }
            self.tokens.refreshToken = refreshToken
            self.lock.release()
            self.logger.warning("kept the rotated refresh token from the unusable answer")
            self.giveUp(reason: reason)
        }
    }

    /// Ends a cycle without new tokens. A still-valid token keeps being used, and a proactive refresh is
    /// tried again later.
    private func giveUp(reason: String) {
        state = .ready
        if refusedGeneration == generation { deadGeneration = generation }
        finishCycle(.unavailable(reason: reason), description: "failed: \(reason)")
        guard let expiresAt = tokens.expiresAt, expiresAt.timeIntervalSinceNow > 0, settings.proactive else { return }
        if refreshTokenInDoubt {
            scheduleProactiveRefresh()  // at expiry, not before
        } else {
            schedulePoactiveRetry(before: expiresAt)
        }
    }

    /// Stored tokens with the expiry tokenrelay will plan with (the file's `expires_at`, else a JWT `exp`).
    private static func withStoredExpiry(_ stored: TokenSet) -> (TokenSet, lifetime: Double?) {
        var tokens = stored
        let expiry = TokenExpiry.forStoredTokens(stored, now: Date())
        tokens.expiresAt = expiry.expiresAt
        return (tokens, expiry.lifetime)
    }

    /// The credentials are dead: release the lock, say why once, latch "login required".
    private func reject(_ message: String, metadata: Logger.Metadata = [:]) {
        lock.release()
        metrics.countRefresh(outcome: "rejected")
        logger.error("\(message)", metadata: metadata)
        latchLoginRequired()
    }

    private func latchLoginRequired() {
        state = .loginRequired
        proactiveTimer = nil
        finishCycle(.rejected, description: "rejected: login required")
    }

    private func finishCycle(_ outcome: Outcome, description: String) {
        retryTimer = nil
        if let pending = pendingSettings { (settings, pendingSettings) = (pending, nil) }
        lastOutcome = (description, Date())
        publish()
        onOutcome?(outcome)
        let waiting = completions
        completions = []
        waiting.forEach { $0(outcome) }
    }

    // MARK: - Refresh hold-off after an unknown outcome

    /// The exponential part of the hold-off stops growing here.
    static let maximumHoldOffBackoff = 300.0

    /// Rule (the race it prevents: a refresh token presented a second time while the server is still
    /// working on its first presentation; a rotation server then sees a burnt token and revokes the
    /// whole session): after an unknown outcome no refresh token leaves again until that exchange cannot
    /// still be in progress at the server. Our side of its connection is closed already (evhttp closes
    /// it before reporting a timeout or a lost connection; an unreadable 2xx was a complete answer), and
    /// the hold-off lasts until `timeouts.refresh_seconds` plus a backoff have passed since the request
    /// was sent. The backoff doubles with each unknown outcome in a row. Meanwhile requests that need a
    /// new token get 503 with `Retry-After`, and `POST /refresh` cannot lift it.
    private func startHoldOff(reason: String) {
        unknownOutcomes += 1
        let backoff = min(settings.backoffSeconds * pow(2, Double(min(unknownOutcomes - 1, 20))), Self.maximumHoldOffBackoff)
        let until = attemptSentAt + refreshTimeout + backoff
        let now = EventLoop.monotonicNow
        let readable = Timestamp.format(Date().addingTimeInterval(until - now))
        holdOff = (until, "refresh outcome unknown (\(reason)); the refresh token is not presented again before \(readable)")
        let timer = LoopEvent(loop: loop) { [weak self] _ in self?.holdOffEnded() }
        holdOffTimer = timer
        timer.schedule(after: max(0, until - now))
        publish()
    }

    /// The hold-off is over. The token file comes first (another process may have the answer we
    /// missed); otherwise the next need (a 401, a dead token at admission, expiry) starts a cycle, which
    /// presents the refresh token once more. Unknown outcomes in a row keep counting.
    private func holdOffEnded() {
        holdOffTimer = nil
        holdOff = nil
        logger.info("refresh hold-off over", metadata: ["unknown_outcomes": "\(unknownOutcomes)"])
        if state != .refreshing, let onDisk = try? newTokensOnDisk() {
            adoptFromDisk(onDisk, reason: "adopted tokens from the token file after an unknown refresh outcome")
            onOutcome?(.renewed(generation: generation))
        } else if state != .refreshing {
            scheduleProactiveRefresh()
        }
        publish()
    }

    /// New tokens settle every doubt.
    private func clearHoldOff() {
        holdOff = nil
        holdOffTimer = nil
        unknownOutcomes = 0
    }

    // MARK: - Storm guard

    /// At most `stormMaxRefreshes` 401-triggered refreshes per window: a token endpoint that keeps
    /// issuing tokens the API rejects must not turn into an endless refresh loop. Only cycles that reach
    /// the token endpoint count (see `runAttempt`): adopting another process's rotation is not a storm.
    private func stormGuardAllowsRefresh() -> Bool {
        let now = EventLoop.monotonicNow
        reactiveRefreshTimes.removeAll { now - $0 >= settings.stormWindowSeconds }
        if reactiveRefreshTimes.count < settings.stormMaxRefreshes { return true }
        let reason = "\(reactiveRefreshTimes.count) refreshes within \(Int(settings.stormWindowSeconds)) s and the API still rejects the token"
        state = .degraded
        stormReason = reason
        metrics.stormGuardTrips.increment()
        logger.error("storm guard: refreshing paused; passing 401s through", metadata: ["reason": "\(reason)"])
        let recoverAfter = settings.stormWindowSeconds - (now - (reactiveRefreshTimes.first ?? now))
        let timer = LoopEvent(loop: loop) { [weak self] _ in
            guard let self, self.state == .degraded else { return }
            self.clearLatches()
            self.logger.info("storm guard: window passed; refreshing allowed again")
        }
        recoveryTimer = timer
        timer.schedule(after: max(0.01, recoverAfter))
        publish()
        return false
    }

    private func clearLatches() {
        state = .ready
        stormReason = nil
        recoveryTimer = nil
        reactiveRefreshTimes = []
        scheduleProactiveRefresh()
        publish()
    }

    // MARK: - Proactive refresh

    private func scheduleProactiveRefresh() {
        proactiveTimer = nil
        guard settings.proactive, state != .loginRequired, let expiresAt = tokens.expiresAt, let lifetime else { return }
        var delay = expiresAt.timeIntervalSinceNow
        if !refreshTokenInDoubt {
            let skew = TokenExpiry.skew(lifetime: lifetime, configured: settings.skewSeconds)
            // Jitter spreads a fleet that got its tokens at the same moment.
            delay -= skew + Double.random(in: 0...(skew * 0.2))
        }
        delay = max(delay, lastCycleStartedAt + Self.minimumCycleSpacing - EventLoop.monotonicNow)
        guard delay > 0 else {
            // Already due at start (or after adopting an old token): an expired token is useless, so
            // requests wait for the new one; one inside the skew still works meanwhile.
            let mode: Mode = expiresAt.timeIntervalSinceNow > 0 ? .proactive : .reactive
            let timer = LoopEvent(loop: loop) { [weak self] _ in self?.startRefreshIfReady(mode: mode) }
            proactiveTimer = timer
            timer.schedule(after: 0)
            return
        }
        // In doubt, the timer fires at expiry: the token is dead then, so requests wait for the new one.
        let mode: Mode = refreshTokenInDoubt ? .reactive : .proactive
        let timer = LoopEvent(loop: loop) { [weak self] _ in self?.startRefreshIfReady(mode: mode) }
        proactiveTimer = timer
        timer.schedule(after: delay)
    }

    private func schedulePoactiveRetry(before expiresAt: Date) {
        let delay = max(Self.minimumCycleSpacing, min(max(settings.backoffSeconds * 4, 1), expiresAt.timeIntervalSinceNow / 2))
        let timer = LoopEvent(loop: loop) { [weak self] _ in self?.startRefreshIfReady(mode: .proactive) }
        proactiveTimer = timer
        timer.schedule(after: delay)
    }

    private func startRefreshIfReady(mode: Mode) {
        guard state == .ready else { return }
        startRefresh(mode: mode, trigger: mode == .proactive ? "expiring" : "expired")
    }

    // MARK: - Token state

    /// Writes tokens fresh from the token endpoint to the token file, off the loop, then continues on it.
    /// The cycle stays `.refreshing` meanwhile: held requests stay held, no second cycle starts, and the
    /// file watch does not mistake our own write for someone else's. Once saved, a draining shutdown may
    /// go ahead (`onTokenEndpointIdle`). A retry of an earlier failed write still under way finishes
    /// first, so an older token set can never land on disk after a newer one.
    private func persist(_ next: TokenSet, then continuation: @escaping () -> Void) {
        if persisting {
            afterSaveRetry = { [weak self] in self?.persist(next, then: continuation) }
            return
        }
        write(next) { [weak self] in
            continuation()
            self?.onTokenEndpointIdle?()
        }
    }

    private var afterSaveRetry: (() -> Void)?

    private func write(_ tokens: TokenSet, then continuation: @escaping () -> Void) {
        let data: Data
        do {
            data = try TokenFile.encode(tokens)
        } catch {
            persistFailed(error)
            return continuation()
        }
        persisting = true
        let path = store.path
        OffLoopWork.run(on: loop, { Result { try TokenFile.write(data, to: path) } }) { [weak self] outcome in
            guard let self else { return }
            self.persisting = false
            switch outcome {
            case .success: self.saved()
            case .failure(let error): self.persistFailed(error)
            }
            // A queued cycle write starts before anyone hears "idle": a draining shutdown must wait for it.
            if let queued = self.afterSaveRetry {
                self.afterSaveRetry = nil
                queued()
            }
            continuation()
        }
    }

    private func saved() {
        knownFileSignature = store.signature()
        if let unsaved = unsavedTokens {
            logger.warning("tokens saved to the token file after failed writes", metadata: ["failed_writes": "\(unsaved.failedWrites)"])
        }
        unsavedTokens = nil
        saveRetryTimer = nil
        publish()
    }

    /// The old refresh token is burnt already; the new one lives in memory only until the next successful
    /// write. Serving goes on (releasing held requests with the new token beats failing them), but the
    /// state is loud: `/status` degraded reason, `tokenrelay_unsaved_tokens` 1, and the write is retried
    /// with backoff until it succeeds (the disk may recover: space freed, the directory remounted).
    private func persistFailed(_ error: any Error) {
        metrics.tokenFileWriteFailures.increment()
        let failedWrites = (unsavedTokens?.failedWrites ?? 0) + 1
        unsavedTokens = ("\(error)", failedWrites)
        if failedWrites == 1 {
            logger.critical("could not persist refreshed tokens; a restart now would need a new login; retrying the write",
                            metadata: ["error": "\(error)"])
        }
        let delay = min(max(settings.backoffSeconds, 0.05) * pow(2, Double(min(failedWrites - 1, 20))), Self.maximumSaveRetryDelay)
        let timer = LoopEvent(loop: loop) { [weak self] _ in self?.retrySave() }
        saveRetryTimer = timer
        timer.schedule(after: delay)
        publish()
    }

    static let maximumSaveRetryDelay = 30.0

    /// A refresh cycle under way will write newer tokens itself; otherwise the tokens in service are
    /// written again.
    private func retrySave() {
        saveRetryTimer = nil
        guard let unsaved = unsavedTokens, !persisting else { return }
        guard state != .refreshing else {
            let timer = LoopEvent(loop: loop) { [weak self] _ in self?.retrySave() }
            saveRetryTimer = timer
            return timer.schedule(after: max(settings.backoffSeconds, 0.05))
        }
        logger.info("retrying the token file write", metadata: ["failed_writes": "\(unsaved.failedWrites)"])
        write(tokens) { [weak self] in self?.onTokenEndpointIdle?() }
    }

    /// At exit, after the loop has stopped: one last synchronous write of tokens that could not be
    /// saved. Throws (one line naming the file and the cause) if even that fails: the process must not
    /// exit 0 with a burnt refresh token on disk.
    func saveUnsavedTokensAtExit() throws {
        guard unsavedTokens != nil else { return }
        do {
            try store.write(tokens)
            unsavedTokens = nil
            logger.warning("tokens saved to the token file at exit")
        } catch {
            throw UnsavedTokensError(description: "exiting with rotated tokens that could not be saved (\(error)); the token file holds a burnt refresh token: a new login will be needed")
        }
    }

    /// Makes `next` the current tokens in memory with a new generation, then plans the next proactive
    /// refresh.
    private func adopt(_ next: TokenSet, lifetime: Double?) {
        redactor.update([next.accessToken, next.refreshToken])
        tokens = next
        refreshTokenInDoubt = false
        self.lifetime = lifetime
        generation += 1
        authorizationValue = injection.value(for: next.accessToken)
        state = .ready
        stormReason = nil
        clearHoldOff()
        scheduleProactiveRefresh()
    }

    /// Picks up token files written by someone else (an operator seeding tokens after "login
    /// required", `tokenrelay token import`, another process's rotation). A `stat` per interval is cheap.
    private func checkTokenFile() {
        guard state != .refreshing, let signature = store.signature(), signature != knownFileSignature else { return }
        knownFileSignature = signature
        do {
            guard let onDisk = try newTokensOnDisk() else { return }
            adoptFromDisk(onDisk, reason: "adopted tokens written to the token file")
            publish()
            onOutcome?(.renewed(generation: generation))
        } catch {
            logger.error("ignoring changed token file", metadata: ["error": "\(error)"])
        }
    }

    private func publish() {
        metrics.tokenGeneration.record(Double(generation))
        metrics.loginRequired.record(state == .loginRequired ? 1 : 0)
        metrics.unsavedTokens.record(unsavedTokens == nil ? 0 : 1)
        metrics.accessTokenExpiresAt.record(tokens.expiresAt?.timeIntervalSince1970 ?? 0)
        metrics.secondsUntilExpiry.record(tokens.expiresAt.map { max(0, $0.timeIntervalSinceNow) } ?? -1)
    }
}

/// Rotated tokens could not be written even at exit.
struct UnsavedTokensError: Error, CustomStringConvertible {
    let description: String
}
