import FoundationEssentials
import Logging

/// The thin driver of `RefreshMachine` on the event loop: it feeds the machine events (requests, 401s,
/// timers, the lock, the token endpoint's answer, the store's writes and changes) with the time, and
/// executes the actions it returns. Every rule is in the machine; nothing here decides.
///
/// Actions are executed in order from one queue: an event that arrives while actions are being executed
/// (a lock taken at once, a write that fails before it starts) appends its actions behind them.
///
/// Confined to the event loop thread.
final class RefreshCoordinator {
    typealias Outcome = RefreshMachine.Outcome
    typealias State = RefreshMachine.State
    typealias Mode = RefreshMachine.Mode
    typealias UnauthorizedDecision = RefreshMachine.UnauthorizedDecision

    /// What a request that just arrived should do.
    enum Admission {
        case send(generation: UInt64, authorization: String)
        case hold
        case loginRequired
        /// The access token is dead and no refresh may start now (the refresh hold-off).
        case unavailable(retryAfter: Int)
    }

    // Internal (was private): RefreshCoordinator+Execution.swift and +Cache.swift.
    var machine: RefreshMachine {
        // Any step may change the answer `admit` keeps (`steadyAdmission`).
        didSet { steadyAdmission = nil }
    }
    /// `admit`'s answer while the machine's is the same for every arrival (`timeIndependentAdmission`): a
    /// request then costs no clock read and no step of the machine. Race-free because the loop owns both:
    /// every change to the machine goes through `machine`, whose observer drops this in the same call,
    /// and `apply` (a new token header) drops it too, before anything else runs on the loop.
    private var steadyAdmission: (generation: UInt64, authorization: String)?
    let loop: EventLoop  // internal (was private): RefreshCoordinator+Execution.swift and +Cache.swift
    let endpoint: TokenEndpointClient  // internal (was private): RefreshCoordinator+Execution.swift
    let store: any TokenStore  // internal (was private): RefreshCoordinator+Execution.swift and +Cache.swift
    private var injection: InjectSettings
    /// DPoP (`dpop`): DPoP-bound tokens go as `Authorization: DPoP <token>` (the driver adds the proof).
    var dpop: DPoPProofs?
    private var refreshTimeout: Double
    private var lockTimeout: Double
    private let storeWriteTimeout: Double
    let logger: Logger  // internal (was private): RefreshCoordinator+Execution.swift and +Cache.swift
    let metrics: RelayMetrics  // internal (was private): RefreshCoordinator+Execution.swift
    let redactor: SecretRedactor  // internal (was private): RefreshCoordinator+Execution.swift

    var timers: [RefreshMachine.Timer: LoopEvent] = [:]  // internal (was private): RefreshCoordinator+Execution.swift
    private var watchTimer: LoopEvent?
    var queue: [RefreshMachine.Action] = []  // internal (was private): RefreshCoordinator+Execution.swift
    var executing = false  // internal (was private): RefreshCoordinator+Execution.swift
    private var authorization: (generation: UInt64, value: String)?
    /// One-shot waiters, e.g. an admin `POST /refresh`.
    var completions: [(Outcome) -> Void] = []  // internal (was private): RefreshCoordinator+Execution.swift
    /// Fleet mode: the local cache of the last adopted tokens (`tokens.file` beside `tokens.redis`).
    let cache: TokenFile?  // internal (was private): RefreshCoordinator+Cache.swift
    var cacheWrite: (inFlight: Bool, pending: TokenSet?) = (false, nil)  // internal (was private): RefreshCoordinator+Cache.swift
    var cachedGeneration: UInt64 = 0  // internal (was private): RefreshCoordinator+Cache.swift
    /// When tokens written by someone else were last adopted, and how they reached us.
    var lastAdoption: (at: Date, source: String)?  // internal set (was private(set)): RefreshCoordinator+Execution.swift

    /// Told of every refresh outcome (the proxy releases its held requests here).
    var onOutcome: ((Outcome) -> Void)?
    /// Called when an exchange with the token endpoint ends and its tokens are saved (graceful shutdown
    /// waits for it).
    var onTokenEndpointIdle: (() -> Void)?

    init(loop: EventLoop, endpoint: TokenEndpointClient, store: any TokenStore, initialTokens: TokenSet, settings: Config.Refresh,
         injection: InjectSettings = InjectSettings(), lockTimeout: Double, refreshTimeout: Double = 60, storeWriteTimeout: Double = 0,
         cache: TokenFile? = nil, metrics: RelayMetrics, redactor: SecretRedactor, logger: Logger) {
        self.loop = loop
        self.cache = cache
        self.storeWriteTimeout = storeWriteTimeout
        self.endpoint = endpoint
        self.store = store
        self.injection = injection
        self.refreshTimeout = refreshTimeout
        self.lockTimeout = lockTimeout
        self.metrics = metrics
        self.redactor = redactor
        self.logger = logger
        var startTokens = initialTokens
        if let redis = store as? RedisTokenStore {
            let (tokens, mark) = UnacknowledgedWriteMark.take(from: initialTokens)
            startTokens = tokens
            if let mark {
                do {
                    try redis.holdUnacknowledged(tokens, mark)
                    logger.warning("the local token cache holds a token set Redis never acknowledged; it is written back once Redis answers",
                                   metadata: ["over_version": "\(mark.overVersion)"])
                } catch {
                    logger.error("could not prepare the local cache's unacknowledged token set for Redis", metadata: ["error": "\(error)"])
                }
            }
        }
        let machineSettings = Self.machineSettings(settings, refreshTimeout: refreshTimeout, lockTimeout: lockTimeout,
                                                   needsRefreshToken: endpoint.needsRefreshToken, storeWriteTimeout: storeWriteTimeout,
                                                   sharedStore: store.isShared)
        machine = RefreshMachine(tokens: startTokens, settings: machineSettings,
                                 now: RefreshMachine.Instant(monotonic: EventLoop.monotonicNow, wall: Date(), jitter: 0.5))
        cachedGeneration = machine.generation
        if store.isShared { machine.awaitStore("connecting to \(store.kind)") }
        publish()
    }

    private static func machineSettings(_ settings: Config.Refresh, refreshTimeout: Double, lockTimeout: Double, needsRefreshToken: Bool,
                                        storeWriteTimeout: Double, sharedStore: Bool) -> RefreshMachine.Settings {
        var machineSettings = RefreshMachine.Settings(settings, refreshTimeout: refreshTimeout, lockTimeout: lockTimeout,
                                                      needsRefreshToken: needsRefreshToken)
        machineSettings.storeWriteTimeout = storeWriteTimeout
        machineSettings.sharedStore = sharedStore
        return machineSettings
    }

    /// 30 days.
    static let longestTimer = 30.0 * 86_400  // internal (was private): RefreshCoordinator+Execution.swift

    /// Drawn on the loop's thread only, like everything the coordinator owns.
    private var jitter = JitterSource()

    // Internal (was private): RefreshCoordinator+Execution.swift.
    func now() -> RefreshMachine.Instant {
        RefreshMachine.Instant(monotonic: EventLoop.monotonicNow, wall: Date(), jitter: jitter.next())
    }

    /// Starts the timers: proactive refresh (at once if the stored token is already due) and the store
    /// watch.
    func start(watchInterval: Double) {
        store.onChange = { [weak self] in self?.storeAnnouncedChange() }
        store.onReachability = { [weak self] outage in
            guard let self else { return }
            self.metrics.storeConnected.record(outage == nil ? 1 : 0)
            self.execute(outage.map { self.machine.storeUnreachable($0, now: self.now()) } ?? self.machine.storeReachable(now: self.now()))
        }
        if let redis = store as? RedisTokenStore {
            redis.onCount = { [weak self] event in
                switch event {
                case .readOnlyReply: self?.metrics.storeReadOnlyReplies.increment()
                case .writePutBack: self?.metrics.storeWritesPutBack.increment()
                case .failoverFollowed: self?.metrics.storeFailoversFollowed.increment()
                }
            }
            redis.onFailoverFollowed = { [weak self] message in self?.logger.warning("followed a Redis failover", metadata: ["detail": "\(message)"]) }
            redis.onSentinelWatchLost = { [weak self] reason in
                self?.logger.warning("lost the sentinel subscription; subscribing to the next sentinel", metadata: ["reason": "\(reason)"])
            }
            redis.onPutBack = { [weak self] message in self?.logger.warning("put a token set lost by Redis back", metadata: ["detail": "\(message)"]) }
            redis.onImportFollowed = { [weak self] message in self?.logger.warning("an operator's import replaced the token set this relay held", metadata: ["detail": "\(message)"]) }
        }
        store.start()
        execute(machine.start(now: self.now(), inFlight: store.readInFlightRecord()))
        let timer = LoopEvent.repeating(loop: loop) { [weak self] in
            self?.watchStore()
            self?.publish()
        }
        watchTimer = timer
        timer.schedule(after: watchInterval)
    }

    // MARK: - Questions the proxy and the admin listener ask

    /// What log lines call the place tokens are kept: fleet operators have no token file to look at.
    private var storeNoun: String { store.isShared ? "the shared token store" : "the token file" }

    func admit() -> Admission {
        if let steady = steadyAdmission { return .send(generation: steady.generation, authorization: steady.authorization) }
        let (admission, actions) = machine.admit(now: self.now())
        execute(actions)
        switch admission {
        case .send(let generation):
            let authorization = authorizationValue(generation)
            if machine.timeIndependentAdmission == generation { steadyAdmission = (generation, authorization) }
            return .send(generation: generation, authorization: authorization)
        case .hold: return .hold
        case .loginRequired: return .loginRequired
        case .unavailable(let retryAfter): return .unavailable(retryAfter: retryAfter)
        }
    }

    /// A request sent with `sentGeneration` came back with a refresh-triggering status (its first send).
    func unauthorized(sentGeneration: UInt64) -> UnauthorizedDecision {
        let (decision, actions) = machine.unauthorized(sentGeneration: sentGeneration, now: self.now())
        execute(actions)
        return decision
    }

    /// A refresh-triggering answer went to the client as it was (its request cannot be replayed).
    func unauthorizedNotReplayable(sentGeneration: UInt64) {
        execute(machine.unauthorizedNotReplayable(sentGeneration: sentGeneration, now: self.now()))
    }

    /// Operator-requested refresh (`POST /refresh`): clears the latch and the storm guard, joins a
    /// running refresh.
    func forceRefresh(completion: @escaping (Outcome) -> Void) {
        let (immediate, actions) = machine.forceRefresh(now: self.now())
        if immediate == nil { completions.append(completion) }
        execute(actions)
        if let immediate { completion(immediate) }
    }

    /// How long a cycle waits for the store's lock. A Redis lock expires by itself: waiting a little longer
    /// than its lifetime reaches the next one even when its holder died. A file lock is waited for three
    /// refreshes long.
    static func lockTimeout(for config: Config) -> Double {
        let refreshSeconds = config.timeouts.refreshSeconds
        return config.tokens.redis.map { $0.effectiveLockSeconds(refreshSeconds: refreshSeconds) + 2 * $0.commandTimeoutSeconds }
            ?? refreshSeconds * 3
    }

    /// Live reload: a refresh in flight finishes with the settings it started with; the next cycle uses
    /// these. The header value changes with the next request. Everything comes from the new config
    /// itself, never from the token endpoint client (which may still hold the old grant while an exchange
    /// runs): a hold-off computed with a stale `refresh_seconds`, or a grant believed not to present a
    /// refresh token, would let a refresh token leave twice.
    ///
    /// `lockLifetime` (a lock that expires by itself) is the life of the next lock taken; a lock already
    /// held keeps its own (`RefreshMachine.lockAcquired` checks that it covers the exchange).
    func apply(settings: Config.Refresh, injection: InjectSettings, refreshTimeout: Double, lockTimeout: Double, lockLifetime: Double? = nil) {
        if let lockLifetime { store.useLockLifetime(lockLifetime) }
        self.injection = injection
        self.refreshTimeout = refreshTimeout
        self.lockTimeout = lockTimeout
        authorization = nil
        steadyAdmission = nil
        let machineSettings = Self.machineSettings(settings, refreshTimeout: refreshTimeout, lockTimeout: lockTimeout,
                                                   needsRefreshToken: settings.needsRefreshToken, storeWriteTimeout: storeWriteTimeout,
                                                   sharedStore: store.isShared)
        execute(machine.apply(machineSettings, now: self.now()))
    }

    var state: State { machine.state }
    var mode: Mode? { machine.mode }
    var tokens: TokenSet { machine.tokens }
    var generation: UInt64 { machine.generation }
    var expiresAt: Date? { machine.tokens.expiresAt }
    var refreshCount: Int { machine.refreshCount }
    var lastOutcome: (description: String, at: Date)? { machine.lastOutcome }
    var degradedReason: String? { machine.degradedReason }
    /// Latched on the client's credential, not on the refresh token: see `RefreshMachine.clientAuthenticationRefused`.
    var clientAuthenticationRefused: Bool { machine.clientAuthenticationRefused }
    var refreshHoldOffReason: String? { machine.holdOff?.reason }
    var unsavedTokens: RefreshMachine.Unsaved? { machine.unsaved }
    var isAccessTokenKnownDead: Bool { machine.isAccessTokenKnownDead }
    /// Why the shared store cannot be reached, or nil.
    var storeOutage: String? { machine.storeOutage }
    /// Why the shared store's node takes no writes (a replica), or nil: not ready while so.
    var storeNotWritableReason: String? { (store as? RedisTokenStore)?.notWritableReason }

    /// For /status: which store, whether it answers, the version in service, who holds the lock, and the
    /// last adoption of someone else's tokens. Never a token.
    var storeStatus: [String: Any] {
        var status: [String: Any] = ["kind": store.kind, "name": store.name, "connected": machine.storeOutage == nil,
                                     "unreachable_reason": machine.storeOutage ?? JSONNull()]
        if let redis = store as? RedisTokenStore {
            status["version"] = redis.version
            status["lock_holder"] = redis.lockHolder ?? JSONNull()
            status["owner_id"] = redis.ownerID
            status["subscribed"] = redis.isSubscribed
            // Where the master is and how it was found (`url`, or the sentinels), the last failover followed,
            // and when the node was last seen no master (ROLE or READONLY).
            status["master"] = ["address": redis.nodeDescription, "found_by": redis.masterFoundBy,
                                "failovers_followed": redis.sentinelState.failoversFollowed, "last_failover": redis.lastFailoverReport,
                                "last_demotion_seen": redis.lastDemotionSeen.map(Timestamp.format) ?? JSONNull()] as [String: Any]
        }
        status["last_adoption"] = lastAdoption.map { ["at": Timestamp.format($0.at), "source": $0.source] } ?? JSONNull()
        return status
    }
    /// Whether an exchange with the token endpoint is under way, or its answer is still being saved: in
    /// both cases the process holds the only copy of a rotated refresh token.
    var isTalkingToTokenEndpoint: Bool { machine.isTalkingToTokenEndpoint || endpoint.isBusy }

    /// Graceful shutdown: no new refresh cycles or retries from now on.
    func stopRefreshing() {
        execute(machine.shutdown(now: self.now()))
    }

    /// At exit, after the loop has stopped: one last synchronous write of tokens that could not be
    /// saved, and a word about a refresh abandoned in flight. Throws one line (naming the file and the
    /// cause, or the abandoned refresh by fingerprint and time) if either is the case: the process must
    /// not exit 0 with a burnt refresh token in the store, or with a refresh whose outcome nobody will
    /// learn.
    func finishAtExit() throws {
        var problems: [String] = []
        if let answer = machine.answerBeingSaved {
            do {
                try store.writeAtExit(dpop?.keepingItsKey(in: answer) ?? answer)
                // Answered and saved: the in-flight record has done its job (the lock is still ours).
                try? store.removeInFlightRecord()
                logger.warning("refreshed tokens saved to \(storeNoun) at exit")
            } catch {
                problems.append("exiting with refreshed tokens that could not be saved (\(error)); "
                                + "\(storeNoun) holds a burnt refresh token: a new login will be needed")
            }
        } else if machine.hasUnsavedTokens {
            do {
                try store.writeAtExit(dpop?.keepingItsKey(in: machine.tokens) ?? machine.tokens)
                machine.savedAtExit()
                logger.warning("tokens saved to \(storeNoun) at exit")
            } catch {
                problems.append("exiting with rotated tokens that could not be saved (\(error)); "
                                + "\(storeNoun) holds a burnt refresh token: a new login will be needed")
            }
        }
        if let abandoned = machine.exchangeInFlight {
            // The in-flight record stays on disk: the next start holds this refresh token back.
            let holdOffEnds = abandoned.sentAt.addingTimeInterval(refreshTimeout + machine.settings.backoffSeconds)
            problems.append("exiting with a token refresh in flight (refresh token \(abandoned.fingerprint), sent at "
                            + "\(Timestamp.format(abandoned.sentAt))); its outcome is unknown: the next start does not present "
                            + "that refresh token before \(Timestamp.format(holdOffEnds))")
        }
        guard problems.isEmpty else { throw UnfinishedBusinessAtExit(description: problems.joined(separator: "; ")) }
    }

    private func authorizationValue(_ generation: UInt64) -> String {
        if let authorization, authorization.generation == generation { return authorization.value }
        let tokens = machine.tokens
        let value = dpop != nil && tokens.dpopBoundThumbprint != nil
            ? DPoPProofs.authorizationScheme + tokens.accessToken : injection.value(for: tokens.accessToken)
        authorization = (generation, value)
        return value
    }
}

/// Rotated tokens could not be written even at exit, or a refresh was abandoned in flight.
struct UnfinishedBusinessAtExit: Error, CustomStringConvertible {
    let description: String
}
