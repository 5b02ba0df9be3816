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
    private let lock: TokenFileLock
    private var settings: Config.Refresh
    private var injection: InjectSettings
    /// Settings from a reload during a cycle: that cycle finishes with the ones it started with.
    private var pendingSettings: Config.Refresh?
    private let lockTimeout: Double
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
    private(set) var degradedReason: String?
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
         settings: Config.Refresh, injection: InjectSettings = InjectSettings(), lockTimeout: Double, metrics: RelayMetrics,
         redactor: SecretRedactor, logger: Logger) {
        self.loop = loop
        self.endpoint = endpoint
        self.store = store
        self.lock = lock
        self.settings = settings
        self.injection = injection
        self.lockTimeout = lockTimeout
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
        completions.append(completion)
        if state == .loginRequired || state == .degraded { clearLatches() }
        startRefresh(mode: .reactive, trigger: "forced")
    }

    var expiresAt: Date? { tokens.expiresAt }

    /// The upstream refused the current access token and a refresh cycle since then ended without new
    /// tokens: every request can only fail until a refresh succeeds or tokens are adopted, both of which
    /// start a new generation. A failed refresh of a token nobody refused says nothing about the token.
    var isAccessTokenKnownDead: Bool { deadGeneration == generation }

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
        guard !stopped else { return }
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
        let kickoff = LoopEvent(loop: loop) { [weak self] _ in self?.runAttempt() }
        retryTimer = kickoff
        kickoff.activate()
    }

    /// One attempt: take the cross-process lock, adopt tokens another process wrote meanwhile, or else
    /// present the refresh token. The lock is held until the result is on disk.
    private func runAttempt() {
        lock.acquire(timeout: lockTimeout) { [weak self] acquired, waited in
            guard let self else { return }
            if waited { self.metrics.lockWaits.increment() }
            guard acquired else {
                self.attempt += 1  // counts, or another process holding the lock would keep this cycle alive forever
                return self.handle(.transient(reason: "timed out waiting for the token file lock \(self.lock.path)", outcomeUnknown: false))
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
            self.endpoint.refresh(current: self.tokens) { [weak self] result in
                self?.metrics.refreshDuration.record(EventLoop.monotonicNow - started)
                self?.handle(result)
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

    private func handle(_ result: TokenEndpointResult) {
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
                // again at once, possibly while that request is still queued at a paused server, is how a
                // rotation server concludes theft. End the cycle; the next one re-reads the token file first.
                logger.error("refresh outcome unknown; not retrying now (the refresh token may already be rotated)",
                             metadata: metadata)
                refreshTokenInDoubt = true
                return giveUp(reason: reason)
            }
            guard attempt < settings.maxAttempts, !stopped else {
                logger.error("refresh failed; giving up for now", metadata: metadata)
                return giveUp(reason: reason)
            }
            let delay = settings.backoffSeconds * pow(2, Double(max(0, attempt - 1))) * Double.random(in: 0.8...1.2)
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
        degradedReason = reason
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
        degradedReason = nil
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
    /// go ahead (`onTokenEndpointIdle`).
    private func persist(_ next: TokenSet, then continuation: @escaping () -> Void) {
        let data: Data
        do {
            data = try TokenFile.encode(next)
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
            case .success: self.knownFileSignature = self.store.signature()
            case .failure(let error): self.persistFailed(error)
            }
            continuation()
            self.onTokenEndpointIdle?()
        }
    }

    /// The old refresh token is burnt already; the new one lives in memory only until the next successful
    /// write. Loud, counted, but serving goes on.
    private func persistFailed(_ error: any Error) {
        metrics.tokenFileWriteFailures.increment()
        logger.critical("could not persist refreshed tokens; a restart now would need a new login", metadata: ["error": "\(error)"])
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
        degradedReason = nil
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
        metrics.accessTokenExpiresAt.record(tokens.expiresAt?.timeIntervalSince1970 ?? 0)
        metrics.secondsUntilExpiry.record(tokens.expiresAt.map { max(0, $0.timeIntervalSinceNow) } ?? -1)
    }
}
