import FoundationEssentials
import Glibc

/// The refresh rules as a value: events in, actions out, time passed in with every event. It owns the
/// tokens in service and their *generation*, and makes sure at most one refresh runs at a time in this
/// process (and, through the store's lock, across processes), however many requests fail at once.
///
/// The race behind all of it: N requests leave with access token A; A expires; N responses come back
/// 401. Refreshing once per 401 would present the same refresh token N times, and a server with refresh
/// token rotation treats the second presentation as theft and revokes the whole session.
///
/// The file reads in cycle order: a request arrives (admission), a 401 comes back, a cycle starts, takes
/// the lock, re-reads the store, presents the refresh token, persists the answer, releases the held
/// requests; then what a cycle leaves behind (hold-off, storm guard, proactive timer, unsaved tokens),
/// tokens adopted from the store, and shutdown. Each rule names the race it prevents.
struct RefreshMachine {
    private(set) var settings: Settings
    private(set) var tokens: TokenSet
    private(set) var generation: UInt64 = 1
    private(set) var phase: Phase = .idle
    private(set) var holdOff: HoldOff?
    private(set) var unsaved: Unsaved?
    private(set) var refreshCount = 0
    private(set) var lastOutcome: (description: String, at: Date)?
    /// The generation the upstream last refused, and the one whose cycle after such a refusal ended
    /// without new tokens (`isAccessTokenKnownDead`).
    private var refusedGeneration: UInt64?
    /// The last latch was the token endpoint refusing the client (`invalid_client`, `unauthorized_client`),
    /// not the refresh token: read through `clientAuthenticationRefused`, which holds only while latched.
    private var latchedOnClientRefusal = false
    private var deadGeneration: UInt64?
    private var lifetime: Double?
    private var unknownOutcomes = 0
    /// The token endpoint's last `Retry-After`, as the monotonic time before which no attempt starts.
    private var notBefore = -Double.infinity
    private var refreshTokenInDoubt = false
    private var lastCycleStartedAt = -Double.infinity
    private var reactiveRefreshTimes: [Double] = []
    /// Refresh tokens this process has presented: never adopt one of them from the store again.
    private var spentRefreshTokens: [String] = []
    /// The mode the proactive timer starts its cycle in.
    private var proactiveMode = Mode.proactive
    /// A write of unsaved tokens (not a cycle's) is under way.
    private var retryWriteInFlight = false
    /// A shared store's cycle write failed and waits for `saveRetry` (or the store coming back) to be
    /// sent again; the cycle stays open meanwhile (`writeFinished`).
    private var cycleWriteAwaitingRetry = false
    /// The store is being re-read because the hold-off ended (not because the watch saw a change).
    private var readingStoreAfterHoldOff = false
    /// The store is being re-read because it is reachable again.
    private var readingStoreAfterOutage = false
    /// The in-flight record believed to be on disk (ours, or one already taken into account).
    private var recordOnDisk: RefreshInFlightRecord?
    private var stopped = false
    private var actions: [Action] = []
    /// Why the shared store cannot be reached (fleet mode), or nil.
    private(set) var storeOutage: String?

    /// How soon a client told 503 while the shared store is unreachable should come back.
    static let storeOutageRetryAfter = 2

    /// A token endpoint that hands out tokens due at once must not turn the proactive timer into a loop.
    static let minimumCycleSpacing = 1.0
    /// A forced refresh (`POST /refresh`) this soon after a renewal gets that renewal's result instead of
    /// a rotation of its own. Race it prevents: a script, or several operators, calling it in a loop would
    /// rotate the refresh token once per call.
    static let forcedRefreshReuseSeconds = 5.0
    /// When the last cycle ended with new tokens (monotonic).
    private var lastRenewalAt = -Double.infinity
    static let maximumHoldOffBackoff = 300.0
    static let maximumSaveRetryDelay = 30.0

    init(tokens stored: TokenSet, settings: Settings, now: Instant) {
        self.settings = settings
        let expiry = TokenExpiry.forStoredTokens(stored, now: now.wall)
        tokens = stored
        tokens.expiresAt = expiry.expiresAt
        lifetime = expiry.lifetime
    }

    // MARK: - Questions the driver and the admin listener ask

    // Not inlined: Swift 6.3's optimizer, inlining this switch into `storeRead` ahead of `adopt` mutating
    // `phase`, fails its own ownership verification and aborts release builds.
    var state: State {
        @inline(never) get {
        switch phase {
        case .idle: return .ready
        case .refreshing: return .refreshing
        case .loginRequired: return .loginRequired
        case .stormPaused: return .degraded
        }
        }
    }

    /// Latched because the token endpoint refused the client, not its refresh token (RFC 6749 §5.2).
    var clientAuthenticationRefused: Bool { state == .loginRequired && latchedOnClientRefusal }

    static let clientRefusalErrors: Set<String> = ["invalid_client", "unauthorized_client"]

    var mode: Mode? {
        if case .refreshing(let cycle) = phase { return cycle.mode }
        return nil
    }

    /// The upstream refused the current access token and a cycle since then ended without new tokens.
    var isAccessTokenKnownDead: Bool { deadGeneration == generation }

    /// An exchange with the token endpoint is under way, or its answer is being written: in both cases
    /// this process may hold the only copy of a rotated refresh token.
    var isTalkingToTokenEndpoint: Bool {
        if retryWriteInFlight { return true }
        guard case .refreshing(let cycle) = phase else { return false }
        switch cycle.step {
        case .recordingInFlight, .exchanging, .persisting: return true
        case .waiting, .acquiringLock: return false
        }
    }

    /// The refresh token presentation whose answer has not arrived: what a shutdown that cannot wait
    /// any longer abandons.
    var exchangeInFlight: RefreshInFlightRecord? {
        guard case .refreshing(let cycle) = phase, case .exchanging(_, let record) = cycle.step else { return nil }
        return record
    }

    var degradedReason: String? {
        if let storeOutage { return "token store unreachable (\(storeOutage)); no refresh without it" }
        if case .stormPaused(let reason) = phase { return reason }
        return holdOff?.reason ?? unsaved.map { "rotated tokens are not saved in the token file: \($0.error)" }
    }

    private func tokenNeedsReplacing(_ now: Instant) -> Bool {
        tokens.accessToken.isEmpty || isAccessTokenKnownDead || (tokens.expiresAt.map { $0 <= now.wall } ?? false)
    }

    // MARK: - Start

    /// `inFlight`: the in-flight record as found at start (nil: not looked at).
    mutating func start(now: Instant, inFlight: RefreshInFlightRead? = nil) -> [Action] {
        if let inFlight { consider(inFlight, lockHeld: false, now) }
        scheduleProactiveRefresh(now)
        if tokens.accessToken.isEmpty { startCycle(.reactive, .noToken, now) }
        return drain()
    }

    // MARK: - 1. A request arrives

    mutating func admit(now: Instant) -> (Admission, [Action]) {
        // Hold-off: a dead token cannot be replaced yet; an answer beats a wait longer than the hold.
        if let retryAfter = holdOffRetryAfter(now), tokenNeedsReplacing(now) { return (.unavailable(retryAfter: retryAfter), drain()) }
        // Shared store unreachable: a dead token cannot be replaced by this relay alone (`storeUnreachable`).
        if storeOutage != nil, tokenNeedsReplacing(now) { return (.unavailable(retryAfter: Self.storeOutageRetryAfter), drain()) }
        // No token yet (a grant that fetches its own, whose first fetch failed): fetch one, hold meanwhile.
        if tokens.accessToken.isEmpty, case .idle = phase { startCycle(.reactive, .noToken, now) }
        switch phase {
        case .idle, .stormPaused: return (.send(generation: generation), drain())
        // During a proactive cycle the current token still works: requests keep flowing.
        case .refreshing(let cycle) where cycle.mode == .proactive: return (.send(generation: generation), drain())
        // During a reactive one the token is dead: spending it would only earn another 401.
        case .refreshing: return (.hold, drain())
        case .loginRequired: return (.loginRequired, drain())
        }
    }

    /// The generation every request arriving now is sent with, when that answer does not depend on when
    /// it arrives: a token is in service, no hold-off and no store outage can turn a request away (those
    /// look at the clock), and no reactive cycle holds requests. `admit` then answers `.send` with this
    /// generation and emits nothing, so a driver may answer arrivals from this value until the machine
    /// next changes (a clock-driven change, an expiry or a hold-off's end, reaches it as a timer event).
    /// nil: ask `admit`.
    var timeIndependentAdmission: UInt64? {
        guard holdOff == nil, storeOutage == nil, !tokens.accessToken.isEmpty else { return nil }
        switch phase {
        case .idle, .stormPaused: return generation
        case .refreshing(let cycle) where cycle.mode == .proactive: return generation
        case .refreshing, .loginRequired: return nil
        }
    }

    // MARK: - 2. A 401 comes back

    mutating func unauthorized(sentGeneration: UInt64, now: Instant) -> (UnauthorizedDecision, [Action]) {
        switch phase {
        case .loginRequired, .stormPaused: return (.passThrough, drain())
        default: break
        }
        // Stale generation: the request left with an older token, which says nothing against the current
        // one. Refreshing on it would burn a refresh token for nothing; replay at once.
        if sentGeneration < generation { return (.replay, drain()) }
        refusedGeneration = generation
        if storeOutage != nil {
            deadGeneration = generation
            return (.unavailable(retryAfter: Self.storeOutageRetryAfter), drain())
        }
        if let retryAfter = holdOffRetryAfter(now) {
            deadGeneration = generation
            return (.unavailable(retryAfter: retryAfter), drain())
        }
        // Coalescing: every 401 for the current generation joins the one cycle.
        if case .refreshing(var cycle) = phase {
            if cycle.mode == .proactive {
                // The token died before the proactive refresh finished: from now on requests wait.
                cycle.mode = .reactive
                phase = .refreshing(cycle)
                log(.info, "access token rejected during a proactive refresh; holding requests until it completes")
            }
            return (.hold, drain())
        }
        guard stormGuardAllowsRefresh(now) else { return (.passThrough, drain()) }
        startCycle(.reactive, .unauthorized, now)
        return (.hold, drain())
    }

    /// A refresh-triggering answer the client gets as it is, because its request cannot be sent again (a
    /// streamed upload whose body has gone). The token is as dead as for any 401, so the same rules apply
    /// (a stale generation says nothing; every such answer joins the one cycle; storm guard, hold-off and
    /// store outage as usual); the request itself is not held. Race it prevents: uploads refused one after
    /// another with nobody refreshing, until a request that could be replayed came along.
    mutating func unauthorizedNotReplayable(sentGeneration: UInt64, now: Instant) -> [Action] {
        unauthorized(sentGeneration: sentGeneration, now: now).1
    }

    /// Storm guard: at most `stormMaxRefreshes` 401-triggered refreshes per window. Race it prevents: a
    /// token endpoint that keeps issuing tokens the API rejects (wrong audience, clock skew) turning into
    /// an endless refresh loop. Only cycles that reach the token endpoint count (adopting another
    /// process's rotation is not a storm).
    private mutating func stormGuardAllowsRefresh(_ now: Instant) -> Bool {
        reactiveRefreshTimes.removeAll { now.monotonic - $0 >= settings.stormWindowSeconds }
        guard reactiveRefreshTimes.count >= settings.stormMaxRefreshes else { return true }
        let reason = "\(reactiveRefreshTimes.count) refreshes within \(Int(settings.stormWindowSeconds)) s and the API still rejects the token"
        phase = .stormPaused(reason: reason)
        emit(.count(.stormGuardTrip))
        log(.error, "storm guard: refreshing paused; passing 401s through", ["reason": reason])
        let recoverAt = (reactiveRefreshTimes.first ?? now.monotonic) + settings.stormWindowSeconds
        emit(.schedule(.stormRecovery, at: max(now.monotonic + 0.01, recoverAt)))
        emit(.publish)
        return false
    }

    /// Operator-requested refresh (`POST /refresh`): clears the login latch and the storm guard, joins a
    /// running cycle. Returns an immediate outcome when it cannot start one.
    mutating func forceRefresh(now: Instant) -> (immediate: Outcome?, [Action]) {
        // Not even an operator may lift the hold-off: presenting the refresh token now is the very reuse
        // it prevents.
        if let holdOff, state != .refreshing { return (.unavailable(reason: holdOff.reason), drain()) }
        // Shutting down: nothing new starts, so nothing would ever answer the caller.
        if stopped, state != .refreshing { return (.unavailable(reason: "shutting down"), drain()) }
        // Tokens renewed a moment ago and nobody refused them since: that renewal is the answer.
        if case .idle = phase, !isAccessTokenKnownDead, now.monotonic - lastRenewalAt < Self.forcedRefreshReuseSeconds {
            log(.info, "forced refresh joined the renewal just made", ["generation": "\(generation)"])
            return (.renewed(generation: generation), drain())
        }
        switch phase {
        case .loginRequired, .stormPaused: clearLatches(now)
        default: break
        }
        startCycle(.reactive, .forced, now)
        return (nil, drain())
    }

    // MARK: - 3. A cycle starts

    private mutating func startCycle(_ mode: Mode, _ trigger: Trigger, _ now: Instant) {
        guard !stopped, holdOff == nil, storeOutage == nil else { return }
        if case .refreshing(var cycle) = phase {
            if mode == .reactive && cycle.mode != .reactive {
                cycle.mode = .reactive
                phase = .refreshing(cycle)
            }
            return
        }
        phase = .refreshing(Cycle(mode: mode, trigger: trigger, settings: settings, step: .waiting))
        lastCycleStartedAt = now.monotonic
        emit(.cancel(.proactive))
        emit(.count(.cycleStarted(trigger)))
        log(.info, "refresh started", ["trigger": trigger.rawValue, "mode": mode.rawValue, "generation": "\(generation)"])
        emit(.publish)
        // The first attempt runs from a timer, never inside this call: the request whose 401 started the
        // cycle must have joined the held list before a cycle that ends at once (tokens adopted from the
        // store, no refresh token) releases it. A `Retry-After` from the last cycle still holds: a
        // server that asked for a pause gets it, however many 401s arrive meanwhile.
        emit(.schedule(.attempt, at: max(now.monotonic, notBefore)))
    }

    // MARK: - 4. Take the lock, re-read the store, present the refresh token

    private mutating func attemptTimerFired(_ now: Instant) {
        guard case .refreshing(var cycle) = phase, case .waiting = cycle.step else { return }
        cycle.step = .acquiringLock
        phase = .refreshing(cycle)
        emit(.acquireLock(timeout: cycle.settings.lockTimeout))
    }

    /// Another process holding the lock past the timeout: counts as an attempt, or it would keep this
    /// cycle alive forever.
    mutating func lockTimedOut(now: Instant) -> [Action] {
        guard case .refreshing(var cycle) = phase, case .acquiringLock = cycle.step else { return drain() }
        cycle.attempt += 1
        phase = .refreshing(cycle)
        let lock = cycle.settings.sharedStore
            ? "the fleet's refresh lock (held by another relay, or the token store did not answer)" : "the token file lock"
        transientFailure("timed out waiting for \(lock)", outcomeUnknown: false, retryAfter: 0, lockHeld: false, now)
        return drain()
    }

    /// Under the lock, the store as it is now. Race it prevents: another process rotated the tokens
    /// while we waited; presenting our (burnt) refresh token would be reuse. Its tokens are adopted instead.
    ///
    /// `inFlight` is the in-flight record as it is now. Race it prevents: another process sharing the
    /// token file presented this very refresh token and was killed before the answer; its lock is gone
    /// with it, but the server may still be working on that presentation (`consider`).
    mutating func lockAcquired(store: StoreRead?, lockValidUntil: Double? = nil, inFlight: RefreshInFlightRead? = nil, now: Instant) -> [Action] {
        guard case .refreshing(var cycle) = phase, case .acquiringLock = cycle.step else {
            emit(.releaseLock)
            return drain()
        }
        if case .latched(_, let reason)? = store {
            // Another relay was refused by the token server: the refresh token is dead fleet-wide.
            emit(.releaseLock)
            reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
            return drain()
        }
        if case .tokens(let stored)? = store, isNewToUs(stored) {
            adopt(stored, now)
            if let inFlight { consider(inFlight, lockHeld: true, now) }
            emit(.count(.adoptedRotation))
            log(.info, "adopted tokens rotated by another process", ["generation": "\(generation)"])
            emit(.releaseLock)
            endCycle(.renewed(generation: generation), description: "adopted from token file", now)
            return drain()
        }
        if let inFlight { consider(inFlight, lockHeld: true, now) }
        if let holdOff {
            emit(.releaseLock)
            giveUp(reason: holdOff.reason, now)
            return drain()
        }
        if cycle.settings.needsRefreshToken && tokens.refreshToken == nil {
            emit(.releaseLock)
            // Not latched in a shared store: a relay that holds nothing says nothing about the fleet's tokens.
            reject("refresh impossible: the token file has no refresh_token; login required", [:], now, latchInStore: false)
            return drain()
        }
        if cycle.settings.sharedStore, case .unreadable(let error)? = store {
            // The fleet may have rotated: presenting our refresh token unseen could be reuse.
            transientFailure("cannot read the token store under the lock: \(error)", outcomeUnknown: false, retryAfter: 0, lockHeld: true, now)
            return drain()
        }
        if case .sealedUnopened(let error)? = store {
            // Race it prevents: another process (a relay restarted with a rotated key, `token import`) sealed a
            // newer rotation we cannot open; presenting our refresh token could be reuse, and our write would
            // replace its tokens with ours.
            transientFailure("cannot open the token file under the lock: \(error)", outcomeUnknown: false, retryAfter: 0, lockHeld: true, now)
            return drain()
        }
        // A lock that expires while the refresh is at the token server lets a second relay present the
        // same refresh token: never send unless the lock outlives the exchange and the write after it.
        // The exchange starts now, bounded by the token endpoint settings in force now: a reload since
        // this cycle began (a longer refresh_seconds) lengthens it, while a lock taken before that reload
        // keeps its own, shorter life. So the longer of the cycle's and the running bounds must fit.
        let exchangeBound = max(cycle.settings.refreshTimeout, settings.refreshTimeout)
            + max(cycle.settings.storeWriteTimeout, settings.storeWriteTimeout)
        if let lockValidUntil, lockValidUntil - now.monotonic < exchangeBound {
            transientFailure("the refresh lock has too little life left to cover a refresh", outcomeUnknown: false, retryAfter: 0,
                             lockHeld: true, now)
            return drain()
        }
        cycle.attempt += 1
        // A shared store keeps its record beside the lock (the lock expires; the record stays until the
        // answer is stored), so a relay that died with an answer it could not write holds the fleet off.
        guard cycle.settings.needsRefreshToken, let refreshToken = tokens.refreshToken else {
            phase = .refreshing(cycle)
            present(now)
            return drain()
        }
        // Durably first (rule in `recordInFlight`), then the refresh token leaves.
        cycle.step = .recordingInFlight(RefreshInFlightRecord(refreshToken: refreshToken, sentAt: now.wall))
        phase = .refreshing(cycle)
        emit(.recordInFlight(RefreshInFlightRecord(refreshToken: refreshToken, sentAt: now.wall)))
        return drain()
    }

    /// Rule (the race it prevents: this process is killed while the server works on its presentation,
    /// and the next start presents the same refresh token again; a rotation server then sees a burnt
    /// token and revokes the whole session): no refresh token leaves before a record of it is on disk
    /// (`RefreshInFlightMarker`). The record stays until the answer is handled and saved, or, after an
    /// unknown outcome, until the refresh token it names is no longer the one in service.
    mutating func inFlightRecorded(now: Instant) -> [Action] {
        guard case .refreshing(let cycle) = phase, case .recordingInFlight(let record) = cycle.step else { return drain() }
        recordOnDisk = record
        present(now)
        return drain()
    }

    /// Nothing left: a transient failure (retried with backoff), never a presentation without a record.
    mutating func inFlightRecordFailed(_ error: String, now: Instant) -> [Action] {
        guard case .refreshing(let cycle) = phase, case .recordingInFlight = cycle.step else { return drain() }
        log(.error, "could not record the refresh in flight; the refresh token was not sent", ["error": error])
        transientFailure("could not record the refresh in flight (\(error))", outcomeUnknown: false, retryAfter: 0, lockHeld: true, now)
        return drain()
    }

    /// Present the refresh token: once per attempt, and never by anyone but this cycle.
    private mutating func present(_ now: Instant) {
        guard case .refreshing(var cycle) = phase else { return }
        let record: RefreshInFlightRecord?
        if case .recordingInFlight(let recorded) = cycle.step { record = recorded } else { record = nil }
        if cycle.attempt == 1 && cycle.trigger == .unauthorized { reactiveRefreshTimes.append(now.monotonic) }
        cycle.step = .exchanging(sentAt: now.monotonic, record: record)
        phase = .refreshing(cycle)
        refreshCount += 1
        if cycle.settings.needsRefreshToken, let refreshToken = tokens.refreshToken {
            spentRefreshTokens = Array((spentRefreshTokens + [refreshToken]).suffix(16))
        }
        emit(.presentRefreshToken(tokens))
    }

    private func isNewToUs(_ candidate: TokenSet) -> Bool {
        let changed = candidate.accessToken != tokens.accessToken || candidate.refreshToken != tokens.refreshToken
        let spent = candidate.refreshToken.map { spentRefreshTokens.contains($0) } ?? false
        return changed && !spent
    }

    // MARK: - 5. The token endpoint answers

    mutating func tokenEndpointAnswered(_ result: TokenEndpointResult, retryAfter: Double?, now: Instant) -> [Action] {
        guard case .refreshing(let cycle) = phase, case .exchanging(let sentAt, _) = cycle.step else { return drain() }
        emit(.count(.refreshDuration(max(0, now.monotonic - sentAt))))
        if let retryAfter { notBefore = now.monotonic + retryAfter }
        switch result {
        case .granted(let grant):
            emit(.count(.refreshOutcome("success")))
            let (next, lifetime) = tokens.renewed(by: grant, now: now.wall)
            emit(.redact([next.accessToken, next.refreshToken]))
            for warning in grant.warnings { log(.warning, "token endpoint answer: \(warning)") }
            persist(next, lifetime: lifetime, purpose: .renewal, cycle)
        case .rejected(let status, let oauthError):
            emit(.count(.refreshError(code: oauthError ?? "http_\(status)")))
            removeInFlightRecord()
            emit(.releaseLock)
            if let oauthError, Self.clientRefusalErrors.contains(oauthError) {
                // The client's credential was refused, not the refresh token: the session is fine. Nothing is
                // latched in the shared store (another relay's credential may be the good one), and a change
                // of the secret or key asks again (Relay+Credentials).
                reject("client authentication refused; keeping the refresh token until the client credential changes",
                       ["status": "\(status)", "error": oauthError], now, latchInStore: false, clientRefused: true)
            } else {
                reject("refresh rejected; login required", ["status": "\(status)", "error": oauthError ?? "none"], now)
            }
        case .transient(let reason, let outcomeUnknown):
            transientFailure(reason, outcomeUnknown: outcomeUnknown, retryAfter: retryAfter ?? 0, lockHeld: true, now)
        case .unusable(let reason):
            // Nothing was sent.
            removeInFlightRecord()
            emit(.releaseLock)
            reject("refresh impossible; login required", ["reason": reason], now)
        case .invalidResponse(let reason, let rotation):
            emit(.count(.refreshOutcome("invalid_response")))
            log(.error, "refresh failed: invalid token endpoint response", ["reason": reason])
            switch rotation {
            case .rotated(let refreshToken) where cycle.settings.needsRefreshToken:
                // Race it prevents: the old refresh token is burnt by this answer; dropping the new one
                // would leave us presenting a burnt token next time.
                var kept = tokens
                kept.refreshToken = refreshToken
                emit(.redact([kept.accessToken, refreshToken]))
                persist(kept, lifetime: lifetime, purpose: .keepRotatedRefreshToken(reason: reason), cycle)
            case .unknown where cycle.settings.needsRefreshToken:
                refreshTokenInDoubt = true
                startHoldOff(sentAt: sentAt, reason: reason, now)
                emit(.releaseLock)
                giveUp(reason: reason, now)
            default:
                // Nothing rotated, and the server is done with it: it answered.
                removeInFlightRecord()
                emit(.releaseLock)
                giveUp(reason: reason, now)
            }
        }
        emit(.tokenEndpointIdle)
        return drain()
    }

    private mutating func transientFailure(_ reason: String, outcomeUnknown: Bool, retryAfter: Double, lockHeld: Bool, _ now: Instant) {
        guard case .refreshing(var cycle) = phase else { return }
        // A definite failure (a 5xx or 429 answer, a refused connection, a record that could not be
        // written): nothing is in progress at the server. An unknown outcome keeps its record.
        if !outcomeUnknown && lockHeld { removeInFlightRecord() }
        if lockHeld { emit(.releaseLock) }
        emit(.count(.refreshOutcome("transient_failure")))
        var metadata = ["reason": reason, "attempt": "\(cycle.attempt)"]
        if outcomeUnknown { metadata["outcome"] = "unknown" }
        if outcomeUnknown && cycle.settings.needsRefreshToken, case .exchanging(let sentAt, _) = cycle.step {
            // Unknown outcome: the server may have rotated the refresh token and may still be working on
            // it. End the cycle and hold off (`startHoldOff`).
            refreshTokenInDoubt = true
            startHoldOff(sentAt: sentAt, reason: reason, now)
            metadata["hold_off_seconds"] = cFormat("%.2f", (holdOff?.until ?? now.monotonic) - now.monotonic)
            log(.error, "refresh outcome unknown; not retrying now (the refresh token may already be rotated)", metadata)
            return giveUp(reason: "refresh outcome unknown (\(reason)); the refresh token is not presented again for now", now)
        }
        guard cycle.attempt < cycle.settings.maxAttempts, !stopped else {
            log(.error, "refresh failed; giving up for now", metadata)
            return giveUp(reason: reason, now)
        }
        // Backoff, doubled per attempt with ±20 % jitter; a server's Retry-After wins over a shorter one
        // (no retry storm against a token endpoint that said how long it needs).
        let exponent = Double(min(max(0, cycle.attempt - 1), 20))
        let backoff = cycle.settings.backoffSeconds * pow(2, exponent) * (0.8 + 0.4 * now.jitter)
        let delay = max(backoff, retryAfter)
        metadata["retry_in"] = cFormat("%.2fs", delay)
        log(.warning, outcomeUnknown ? "refresh outcome unknown; retrying" : "refresh failed; retrying", metadata)
        cycle.step = .waiting
        phase = .refreshing(cycle)
        emit(.schedule(.attempt, at: now.monotonic + delay))
    }

    // MARK: - 6. Persist before release

    /// Race it prevents: the old refresh token is burnt the moment the server answered; releasing held
    /// requests (or crashing) before the new one is on disk could lose the session. The cycle stays open
    /// meanwhile, so held requests stay held and no second cycle starts. One write at a time: an
    /// earlier retry's write finishes first, so older tokens can never land after newer ones.
    private mutating func persist(_ next: TokenSet, lifetime: Double?, purpose: PersistPurpose, _ cycle: Cycle) {
        var cycle = cycle
        cycle.step = .persisting(next, lifetime: lifetime, purpose: purpose, queued: retryWriteInFlight)
        phase = .refreshing(cycle)
        if !retryWriteInFlight { emit(.persist(next)) }
    }

    mutating func persisted(now: Instant) -> [Action] {
        writeFinished(error: nil, now)
        return drain()
    }

    /// The shared store holds a newer version than the one this write was based on (its compare-and-set
    /// lost). Race it prevents: a stale writer (its lock expired, a paused process, an operator's import
    /// meanwhile) overwriting a newer rotation. The stale writer loses: what the store holds is adopted,
    /// and the cycle ends with it.
    mutating func persistConflicted(_ stored: StoreRead, now: Instant) -> [Action] {
        emit(.count(.storeConflict))
        switch stored {
        case .tokens(let newer) where isNewToUs(newer): break
        case .latched: break
        default:
            // What the store holds now is no newer than ours (a refresh token we already presented, our own
            // old tokens, nothing, or unreadable): our fresh tokens are the only live ones. Dropping them
            // would lose the session; they stay in service as unsaved and the write is retried on the
            // version just read (the driver bases the next compare-and-set on it).
            log(.warning, "the token store changed under our write but holds nothing newer; keeping our tokens and writing again")
            writeFinished(error: "the token store changed under our write (compare-and-set lost to an older token set)", now)
            return drain()
        }
        let isRetryWrite = retryWriteInFlight
        retryWriteInFlight = false
        guard isRetryWrite || { if case .refreshing(let c) = phase, case .persisting(_, _, _, false) = c.step { return true }; return false }() else {
            return drain()
        }
        if unsaved != nil {
            unsaved = nil
            emit(.cancel(.saveRetry))
        }
        log(.warning, "a newer token set was stored meanwhile; our write lost its compare-and-set and the stored one is adopted")
        if case .refreshing = phase { emit(.releaseLock) }
        switch stored {
        case .tokens(let newer) where isNewToUs(newer):
            adopt(newer, now)
            emit(.count(.adoptedRotation))
            endCycleOrRelease(now)
        case .latched(_, let reason):
            reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
        default: break
        }
        emit(.tokenEndpointIdle)
        return drain()
    }

    private mutating func endCycleOrRelease(_ now: Instant) {
        if case .refreshing = phase {
            endCycle(.renewed(generation: generation), description: "adopted from the token store after a lost write", now)
        } else {
            emit(.publish)
            emit(.release(.renewed(generation: generation)))
        }
    }

    // MARK: - 15. A shared store out of reach

    /// The shared store (Redis) cannot be reached. Race it prevents: a relay refreshing on its own burns
    /// the refresh token for the whole fleet, which then presents it again. So nothing is refreshed: the
    /// access token in hand serves while it is not known dead; after that requests get 503 with
    /// `Retry-After` (`admit`, `unauthorized`). A cycle that has not reached the token server ends now
    /// (its held requests get the reason); one already at the token server finishes, and its write is
    /// retried until the store is back.
    mutating func storeUnreachable(_ reason: String, now: Instant) -> [Action] {
        let changed = storeOutage != reason
        storeOutage = reason
        if changed { log(.error, "token store unreachable; serving with the current access token while it lasts, no refresh", ["reason": reason]) }
        if case .refreshing(let cycle) = phase {
            switch cycle.step {
            case .waiting, .acquiringLock, .recordingInFlight:
                // Nothing has left yet (a record being written only holds the fleet off a while).
                emit(.releaseLock)
                giveUp(reason: "token store unreachable (\(reason)); no relay may refresh without it", now)
            case .exchanging, .persisting: break
            }
        }
        emit(.publish)
        return drain()
    }

    /// At start, before the shared store has answered: as unreachable, without the alarm.
    mutating func awaitStore(_ reason: String) {
        storeOutage = reason
    }

    /// Back: the store is read first (the fleet may have rotated meanwhile), then the proactive timer
    /// (or a cycle for a token that is missing or dead) takes over again.
    mutating func storeReachable(now: Instant) -> [Action] {
        guard storeOutage != nil else { return drain() }
        storeOutage = nil
        log(.info, "token store reachable again")
        // Rotated tokens we could not write go first, at once, not after the retry backoff. Race it
        // prevents: the lock we held runs out meanwhile and another relay, reading the old version under
        // its own lock, presents the refresh token our refresh already burnt.
        if unsaved != nil { retrySave(now) }
        readingStoreAfterOutage = true
        emit(.readStore)
        emit(.publish)
        return drain()
    }

    mutating func persistFailed(_ error: String, now: Instant) -> [Action] {
        writeFinished(error: error, now)
        return drain()
    }

    private mutating func writeFinished(error: String?, _ now: Instant) {
        if retryWriteInFlight {
            retryWriteInFlight = false
            if let error { markUnsaved(error, now) } else { markSaved() }
            // The record of the exchange whose answer this saves names a refresh token no longer in the
            // file: stale, removed under the lock by the next cycle (not here: without the lock it could
            // be another process's record by now).
            // A cycle's write that queued behind it goes now, before anyone hears "idle".
            if case .refreshing(var cycle) = phase, case .persisting(let next, let lifetime, let purpose, true) = cycle.step {
                cycle.step = .persisting(next, lifetime: lifetime, purpose: purpose, queued: false)
                phase = .refreshing(cycle)
                emit(.persist(next))
            }
            emit(.tokenEndpointIdle)
            return
        }
        guard case .refreshing(let cycle) = phase, case .persisting(let next, let lifetime, let purpose, false) = cycle.step else { return }
        cycleWriteAwaitingRetry = false
        if let error, settings.sharedStore, !stopped {
            // Persist before release, fleet form. Race it prevents: the fleet's other relays read the
            // store, not our memory; serving the new tokens before the store holds them lets another
            // relay (or this one restarted) present the refresh token this answer just burnt. So the
            // cycle stays open: held requests stay held until the store acknowledges (or their hold
            // timeout answers them 503 with Retry-After), and the same write is sent again with backoff
            // and at once when the store is back.
            markUnsaved(error, now)
            cycleWriteAwaitingRetry = true
            log(.warning, "held requests wait until the shared token store acknowledges the refreshed tokens", ["error": error])
            return
        }
        // Serving beats failing: the new tokens are used even if they could not be written, but the
        // state is loud (`markUnsaved`). The in-flight record goes once the answer is saved; while the
        // token file still holds the presented (burnt) refresh token, it keeps holding a restart off.
        if let error { markUnsaved(error, now) } else { markSaved(); removeInFlightRecord() }
        switch purpose {
        case .renewal:
            adopt(next, lifetime: lifetime, now)
            emit(.releaseLock)
            log(.info, "refresh succeeded", ["generation": "\(generation)", "attempt": "\(cycle.attempt)",
                                              "expires_at": tokens.expiresAt.map(Timestamp.format) ?? "unknown"])
            endCycle(.renewed(generation: generation), description: "success", now)
        case .keepRotatedRefreshToken(let reason):
            tokens.refreshToken = next.refreshToken
            emit(.releaseLock)
            log(.warning, "kept the rotated refresh token from the unusable answer")
            giveUp(reason: reason, now)
        }
        emit(.tokenEndpointIdle)
    }

    // MARK: - 7. The cycle ends

    private mutating func endCycle(_ outcome: Outcome, description: String, _ now: Instant) {
        emit(.cancel(.attempt))
        if case .refreshing = phase { phase = .idle }
        if case .renewed = outcome { lastRenewalAt = now.monotonic }
        lastOutcome = (description, now.wall)
        emit(.publish)
        emit(.release(outcome))
    }

    /// Ends a cycle without new tokens. A still-valid token keeps being used, and a proactive refresh is
    /// tried again later (at expiry, not before, while the refresh token is in doubt).
    private mutating func giveUp(reason: String, _ now: Instant) {
        phase = .idle
        if refusedGeneration == generation { deadGeneration = generation }
        endCycle(.unavailable(reason: reason), description: "failed: \(reason)", now)
        guard let expiresAt = tokens.expiresAt, expiresAt > now.wall, settings.proactive, !stopped else { return }
        if refreshTokenInDoubt {
            scheduleProactiveRefresh(now)
        } else {
            let remaining = expiresAt.timeIntervalSince(now.wall)
            let delay = max(Self.minimumCycleSpacing, min(max(settings.backoffSeconds * 4, 1), remaining / 2))
            proactiveMode = .proactive
            emit(.schedule(.proactive, at: now.monotonic + delay))
        }
    }

    /// The credentials are dead: say why once, latch "login required". No storm: nothing refreshes until
    /// the store changes or an operator forces a refresh.
    private mutating func reject(_ message: String, _ metadata: [String: String], _ now: Instant, latchInStore: Bool = true,
                                 clientRefused: Bool = false) {
        latchedOnClientRefusal = clientRefused
        emit(.count(.refreshOutcome("rejected")))
        log(.error, message, metadata)
        // Fleet-wide: stored with the token set, so the other relays stop too instead of each trying once.
        if latchInStore { emit(.latchLoginRequired(message)) }
        phase = .loginRequired
        emit(.cancel(.proactive))
        endCycle(.rejected, description: clientRefused ? "rejected: client authentication refused" : "rejected: login required", now)
    }

    // MARK: - 8. The refresh hold-off after an unknown outcome

    /// Rule (the race it prevents: a refresh token presented a second time while the server is still
    /// working on its first presentation; a rotation server then sees a burnt token and revokes the whole
    /// session): after an unknown outcome no refresh token leaves again until that exchange cannot still
    /// be in progress at the server. Our side of its connection is closed already (the token endpoint
    /// client's connection is reset when a request fails), and the hold-off lasts
    /// until `refreshTimeout` plus a backoff have passed since the request was sent; the backoff doubles
    /// with each unknown outcome in a row. Meanwhile requests that need a new token get 503 with
    /// `Retry-After`, and a forced refresh cannot lift it.
    private mutating func startHoldOff(sentAt: Double, reason: String, _ now: Instant) {
        let until = sentAt + nextHoldOffLength()
        let readable = Timestamp.format(now.wall.addingTimeInterval(until - now.monotonic))
        holdOff(until: until, reason: "refresh outcome unknown (\(reason)); the refresh token is not presented again before \(readable)")
    }

    /// The cycle's attempt wrote (or is writing) an in-flight record.
    private var cycleHasRecordOut: Bool {
        guard case .refreshing(let cycle) = phase else { return false }
        switch cycle.step {
        case .recordingInFlight, .persisting: return true
        case .exchanging(_, let record): return record != nil
        case .waiting, .acquiringLock: return false
        }
    }

    /// `refreshTimeout` plus the backoff for one more unknown outcome in a row.
    private mutating func nextHoldOffLength() -> Double {
        unknownOutcomes += 1
        let exponent = Double(min(unknownOutcomes - 1, 20))
        return settings.refreshTimeout + min(settings.backoffSeconds * pow(2, exponent), Self.maximumHoldOffBackoff)
    }

    private mutating func holdOff(until: Double, reason: String) {
        holdOff = HoldOff(until: until, reason: reason)
        emit(.schedule(.holdOff, at: until))
        emit(.publish)
    }

    /// The same rule across restarts and processes, from the in-flight record (`inFlightRecorded`): a
    /// record for the refresh token in service whose exchange may still be in progress at the server
    /// (sent less than `refreshTimeout` plus the backoff ago) starts the hold-off; one whose time has
    /// passed leaves the refresh token in doubt (presented again only when needed, which replaces the
    /// record). The wall clock may have jumped: the hold-off never lasts longer than it would from now.
    /// A record for another refresh token is stale: removed, but only under the lock (`lockHeld`), or
    /// it could be the record of a process that rotated and presented again meanwhile; elsewhere it is
    /// ignored. An unreadable record (ours are written atomically, so not ours) counts as one for the
    /// refresh token in service, sent when the file was last written.
    private mutating func consider(_ read: RefreshInFlightRead, lockHeld: Bool, _ now: Instant) {
        let inService = settings.needsRefreshToken ? tokens.refreshToken.map(TokenFingerprint.of) : nil
        let record: RefreshInFlightRecord
        switch read {
        case .none:
            recordOnDisk = nil
            return
        case .unreadable(let error, let writtenAt):
            guard inService != nil else { return }
            record = RefreshInFlightRecord(fingerprint: "unreadable", sentAt: writtenAt)
            if record != recordOnDisk { log(.error, "in-flight refresh marker unreadable; treating it as a refresh of the refresh token in service", ["error": error]) }
        case .record(let found):
            guard let inService, found.fingerprint == inService else {
                recordOnDisk = nil
                if lockHeld {
                    log(.info, "removed a stale in-flight refresh marker (it names another refresh token)", ["refresh_token": found.fingerprint])
                    emit(.removeInFlightRecord)
                }
                return
            }
            record = found
        }
        // Ours, or one already taken into account: the hold-off it started covers it.
        guard record != recordOnDisk, holdOff == nil else { return }
        recordOnDisk = record
        refreshTokenInDoubt = true
        let length = nextHoldOffLength()
        let remaining = min(record.sentAt.addingTimeInterval(length).timeIntervalSince(now.wall), length)
        let metadata = ["refresh_token": record.fingerprint, "sent_at": Timestamp.format(record.sentAt)]
        guard remaining > 0 else {
            log(.warning, "a refresh sent by a previous run ended with an unknown outcome; the refresh token may have been rotated", metadata)
            if case .idle = phase { scheduleProactiveRefresh(now) }
            return
        }
        let readable = Timestamp.format(now.wall.addingTimeInterval(remaining))
        log(.warning, "a refresh sent by a previous run may still be in progress; holding the refresh token back",
            metadata.merging(["until": readable]) { kept, _ in kept })
        holdOff(until: now.monotonic + remaining,
                reason: "a refresh sent by a previous run may still be in progress (refresh token \(record.fingerprint), sent at "
                    + "\(Timestamp.format(record.sentAt))); the refresh token is not presented again before \(readable)")
    }

    /// Only while holding the lock: without it, the file may be another process's record by now.
    private mutating func removeInFlightRecord() {
        guard cycleHasRecordOut else { return }
        recordOnDisk = nil
        emit(.removeInFlightRecord)
    }

    private func holdOffRetryAfter(_ now: Instant) -> Int? {
        guard let holdOff else { return nil }
        let remaining = holdOff.until - now.monotonic
        guard remaining > 0 else { return nil }
        return Int(min(remaining, 3600).rounded(.up))
    }

    /// The hold-off is over: the store first (another process may hold the answer we missed), then the
    /// next need starts a cycle that presents the refresh token once more.
    private mutating func holdOffEnded(_ now: Instant) {
        holdOff = nil
        log(.info, "refresh hold-off over", ["unknown_outcomes": "\(unknownOutcomes)"])
        readingStoreAfterHoldOff = true
        emit(.readStore)
        emit(.publish)
    }

    // MARK: - 9. Proactive refresh

    /// Ahead of expiry by the skew (plus jitter that spreads a fleet that got its tokens together); at
    /// expiry and not before while the refresh token is in doubt (race it prevents: presenting a
    /// maybe-rotated refresh token early, when nothing needs it yet). Time-triggered cycles are spaced by
    /// `minimumCycleSpacing`.
    private mutating func scheduleProactiveRefresh(_ now: Instant) {
        emit(.cancel(.proactive))
        guard settings.proactive, !stopped, state != .loginRequired, let expiresAt = tokens.expiresAt, let lifetime else { return }
        var delay = expiresAt.timeIntervalSince(now.wall)
        if !refreshTokenInDoubt {
            let skew = TokenExpiry.skew(lifetime: lifetime, configured: settings.skewSeconds)
            delay -= skew + now.jitter * skew * 0.2
        }
        delay = max(delay, lastCycleStartedAt + Self.minimumCycleSpacing - now.monotonic)
        if delay <= 0 {
            // Already due: an expired token is useless, so requests wait for the new one; one inside the
            // skew still works meanwhile.
            proactiveMode = expiresAt > now.wall ? .proactive : .reactive
        } else {
            proactiveMode = refreshTokenInDoubt ? .reactive : .proactive
        }
        emit(.schedule(.proactive, at: now.monotonic + max(0, delay)))
    }

    // MARK: - 10. Timers

    mutating func timerFired(_ timer: Timer, now: Instant) -> [Action] {
        switch timer {
        case .attempt: attemptTimerFired(now)
        case .proactive:
            if case .idle = phase { startCycle(proactiveMode, proactiveMode == .proactive ? .expiring : .expired, now) }
        case .stormRecovery:
            if case .stormPaused = phase {
                clearLatches(now)
                log(.info, "storm guard: window passed; refreshing allowed again")
            }
        case .holdOff: holdOffEnded(now)
        case .saveRetry: retrySave(now)
        }
        return drain()
    }

    private mutating func clearLatches(_ now: Instant) {
        phase = .idle
        emit(.cancel(.stormRecovery))
        reactiveRefreshTimes = []
        scheduleProactiveRefresh(now)
        emit(.publish)
    }

    // MARK: - 11. Unsaved tokens

    /// Rotated tokens that could not be written stay in service, visibly (`degradedReason`, the unsaved
    /// gauge), and the write is retried with backoff until it succeeds. Race it prevents: a restart (or
    /// another process) reading the burnt refresh token that is still on disk.
    private mutating func markUnsaved(_ error: String, _ now: Instant) {
        emit(.count(.tokenFileWriteFailure))
        let failedWrites = (unsaved?.failedWrites ?? 0) + 1
        unsaved = Unsaved(error: error, failedWrites: failedWrites)
        if failedWrites == 1 {
            log(.critical, "could not persist refreshed tokens; a restart now would need a new login; retrying the write", ["error": error])
        }
        let exponent = Double(min(failedWrites - 1, 20))
        let delay = min(max(settings.backoffSeconds, 0.05) * pow(2, exponent), Self.maximumSaveRetryDelay)
        emit(.schedule(.saveRetry, at: now.monotonic + delay))
        emit(.publish)
    }

    private mutating func markSaved() {
        if let unsaved { log(.warning, settings.sharedStore ? "tokens saved to the shared token store after failed writes" : "tokens saved to the token file after failed writes", ["failed_writes": "\(unsaved.failedWrites)"]) }
        unsaved = nil
        emit(.cancel(.saveRetry))
        emit(.publish)
    }

    private static func unreadableReason(_ read: StoreRead) -> String? {
        switch read {
        case .unreadable(let error), .sealedUnopened(let error): error
        default: nil
        }
    }

    /// A cycle under way writes newer tokens itself; otherwise the tokens in service are written again.
    private mutating func retrySave(_ now: Instant) {
        guard let unsaved, !retryWriteInFlight else { return }
        if cycleWriteAwaitingRetry, case .refreshing(let cycle) = phase, case .persisting(let next, _, _, false) = cycle.step {
            cycleWriteAwaitingRetry = false
            log(.info, "retrying the shared token store write", ["failed_writes": "\(unsaved.failedWrites)"])
            emit(.persist(next))
            return
        }
        if case .refreshing = phase {
            emit(.schedule(.saveRetry, at: now.monotonic + max(settings.backoffSeconds, 0.05)))
            return
        }
        log(.info, settings.sharedStore ? "retrying the shared token store write" : "retrying the token file write",
            ["failed_writes": "\(unsaved.failedWrites)"])
        retryWriteInFlight = true
        emit(.persist(tokens))
    }

    /// Whether tokens in service are not in the store (the driver's last write at exit).
    var hasUnsavedTokens: Bool { unsaved != nil }

    mutating func savedAtExit() { unsaved = nil }

    /// The answer whose write was still under way when the loop stopped (a second signal, the drain's
    /// last grace): the driver writes it synchronously at exit. Race it prevents: the process ending
    /// while a helper thread writes, leaving the token file with the refresh token the answer burnt.
    var answerBeingSaved: TokenSet? {
        guard case .refreshing(let cycle) = phase, case .persisting(let next, _, _, _) = cycle.step else { return nil }
        return next
    }

    // MARK: - 12. Tokens from the store

    /// The store changed under us (an operator seeding tokens after "login required", `token import`,
    /// another process's rotation) or was re-read at the end of a hold-off. Not during a cycle: the
    /// cycle re-reads it under the lock itself, and its own write must not look like someone else's.
    ///
    /// `inFlight`, the in-flight record read with it, is considered for the tokens in service afterwards
    /// (`consider`): the process that wrote them may have been killed while presenting their refresh token.
    mutating func storeRead(_ read: StoreRead, inFlight: RefreshInFlightRead? = nil, now: Instant) -> [Action] {
        let afterHoldOff = readingStoreAfterHoldOff
        readingStoreAfterHoldOff = false
        let afterOutage = readingStoreAfterOutage
        readingStoreAfterOutage = false
        if case .refreshing(let cycle) = phase {
            // A shared store announces another relay's rotation while this one waits for the lock: adopt
            // it and end the cycle without presenting anything (the driver of a file store, which cannot
            // cancel a lock wait, does not deliver reads during a cycle).
            switch (cycle.step, read) {
            case (.waiting, .tokens(let stored)) where isNewToUs(stored), (.acquiringLock, .tokens(let stored)) where isNewToUs(stored):
                adopt(stored, now)
                emit(.count(.adoptedRotation))
                log(.info, "adopted tokens another relay published", ["generation": "\(generation)"])
                emit(.releaseLock)
                endCycle(.renewed(generation: generation), description: "adopted from the token store", now)
            case (.waiting, .latched(_, let reason)), (.acquiringLock, .latched(_, let reason)):
                emit(.releaseLock)
                reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
            default: break
            }
            return drain()
        }
        if case .latched(let stored, let reason) = read {
            // Login required, fleet-wide, until new tokens are stored.
            if state != .loginRequired, !isNewToUs(stored) || stored.refreshToken != nil {
                reject("another relay's refresh was rejected; login required", ["reason": reason], now, latchInStore: false)
            }
            return drain()
        }
        if case .tokens(let stored) = read, isNewToUs(stored) {
            let previous = state
            adopt(stored, now)
            if let inFlight { consider(inFlight, lockHeld: false, now) }
            emit(.count(.adoptedRotation))
            log(.info, "adopted tokens written to the token file", ["generation": "\(generation)", "previous_state": previous.rawValue])
            emit(.publish)
            emit(.release(.renewed(generation: generation)))
            return drain()
        }
        if let error = Self.unreadableReason(read) {
            let place = settings.sharedStore ? "the shared token store" : "the token file"
            log(.error, afterHoldOff ? "could not re-read \(place) after the refresh hold-off"
                    : "could not read \(place); keeping the tokens in service", ["error": error])
        }
        if let inFlight { consider(inFlight, lockHeld: false, now) }
        // Nothing new after the hold-off: the proactive timer (at expiry while in doubt) takes over again.
        if afterHoldOff && holdOff == nil { scheduleProactiveRefresh(now) }
        if afterOutage, case .idle = phase {
            scheduleProactiveRefresh(now)
            // Nothing to serve with (a first start with Redis down, a token refused meanwhile): fetch now.
            if tokens.accessToken.isEmpty || isAccessTokenKnownDead { startCycle(.reactive, tokens.accessToken.isEmpty ? .noToken : .unauthorized, now) }
        }
        return drain()
    }

    /// Stored tokens (not fresh from the token endpoint): the expiry comes from the store or the JWT.
    private mutating func adopt(_ stored: TokenSet, _ now: Instant) {
        let expiry = TokenExpiry.forStoredTokens(stored, now: now.wall)
        var next = stored
        next.expiresAt = expiry.expiresAt
        // Tokens someone else wrote supersede ours: nothing of ours is left to save.
        if unsaved != nil {
            unsaved = nil
            emit(.cancel(.saveRetry))
        }
        adopt(next, lifetime: expiry.lifetime, now)
    }

    /// Makes `next` the tokens in service with a new generation; new tokens settle every doubt.
    private mutating func adopt(_ next: TokenSet, lifetime: Double?, _ now: Instant) {
        emit(.redact([next.accessToken, next.refreshToken]))
        tokens = next
        self.lifetime = lifetime
        generation += 1
        refreshTokenInDoubt = false
        holdOff = nil
        unknownOutcomes = 0
        emit(.cancel(.holdOff))
        if case .stormPaused = phase { phase = .idle }
        if case .loginRequired = phase { phase = .idle }
        scheduleProactiveRefresh(now)
    }

    // MARK: - 13. Settings and shutdown

    /// Live reload: a cycle in flight finishes with the settings it started with; the next uses these.
    mutating func apply(_ settings: Settings, now: Instant) -> [Action] {
        self.settings = settings
        if case .idle = phase { scheduleProactiveRefresh(now) }
        return drain()
    }

    /// Graceful shutdown: no new cycle, retry or proactive refresh starts. An attempt already due and an
    /// exchange already talking to the token endpoint finish, because the answer may carry the only copy
    /// of a rotated refresh token (the drain waits for `isTalkingToTokenEndpoint`).
    mutating func shutdown(now: Instant) -> [Action] {
        stopped = true
        emit(.cancel(.proactive))
        return drain()
    }

    // MARK: - Plumbing

    private mutating func emit(_ action: Action) { actions.append(action) }

    private mutating func log(_ level: LogLevel, _ message: String, _ metadata: [String: String] = [:]) {
        emit(.log(level, message, metadata))
    }

    private mutating func drain() -> [Action] {
        defer { actions = [] }
        return actions
    }
}
