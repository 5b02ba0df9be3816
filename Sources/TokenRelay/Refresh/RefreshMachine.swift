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
/// The rules read in cycle order across the files beside this one: `+Admission` (a request arrives, a 401
/// comes back), `+Cycle` (a cycle starts, takes the lock, re-reads the store, presents the refresh token,
/// reads the answer), `+Persistence` (persists before it releases the held requests, a shared store out of
/// reach, how a cycle ends), then what a cycle leaves behind: `+HoldOff`, `+Timers` (proactive timer,
/// unsaved tokens), `+Adoption` (tokens adopted from the store, settings, shutdown). Each rule names the
/// race it prevents. This file holds the state and the questions drivers ask.
///
/// The state below is written only by the machine's own files (the rules span several files, so Swift's
/// `private` cannot express that); drivers and tests read it and never assign it.
struct RefreshMachine {
    var settings: Settings
    var tokens: TokenSet
    var generation: UInt64 = 1
    var phase: Phase = .idle
    var holdOff: HoldOff?
    var unsaved: Unsaved?
    var refreshCount = 0
    var lastOutcome: (description: String, at: Date)?
    /// The generation the upstream last refused, and the one whose cycle after such a refusal ended
    /// without new tokens (`isAccessTokenKnownDead`).
    var refusedGeneration: UInt64?
    /// The last latch was the token endpoint refusing the client (`invalid_client`, `unauthorized_client`),
    /// not the refresh token: read through `clientAuthenticationRefused`, which holds only while latched.
    var latchedOnClientRefusal = false
    var deadGeneration: UInt64?
    var lifetime: Double?
    var unknownOutcomes = 0
    /// The token endpoint's last `Retry-After`, as the monotonic time before which no attempt starts.
    var notBefore = -Double.infinity
    var refreshTokenInDoubt = false
    var lastCycleStartedAt = -Double.infinity
    /// When the tokens in service were adopted from the store (monotonic); nil while they come from this
    /// relay's own refresh, or from the store as found at start.
    var adoptedAt: Double?
    /// The tokens in service come from this relay's own refresh (not from the store).
    var obtainedHere = false
    var reactiveRefreshTimes: [Double] = []
    /// Refresh tokens this process has presented: never adopt one of them from the store again.
    var spentRefreshTokens: [String] = []
    /// The mode the proactive timer starts its cycle in.
    var proactiveMode = Mode.proactive
    /// A write of unsaved tokens (not a cycle's) is under way.
    var retryWriteInFlight = false
    /// A shared store's cycle write failed and waits for `saveRetry` (or the store coming back) to be
    /// sent again; the cycle stays open meanwhile (`writeFinished`).
    var cycleWriteAwaitingRetry = false
    /// The store is being re-read because the hold-off ended (not because the watch saw a change).
    var readingStoreAfterHoldOff = false
    /// The store is being re-read because it is reachable again.
    var readingStoreAfterOutage = false
    /// The in-flight record believed to be on disk (ours, or one already taken into account).
    var recordOnDisk: RefreshInFlightRecord?
    var stopped = false
    var actions: [Action] = []
    /// Why the shared store cannot be reached (fleet mode), or nil.
    var storeOutage: String?

    /// How soon a client told 503 while the shared store is unreachable should come back.
    static let storeOutageRetryAfter = 2

    /// A token endpoint that hands out tokens due at once must not turn the proactive timer into a loop.
    static let minimumCycleSpacing = 1.0
    /// A forced refresh (`POST /refresh`) this soon after a renewal gets that renewal's result instead of
    /// a rotation of its own. Race it prevents: a script, or several operators, calling it in a loop would
    /// rotate the refresh token once per call.
    static let forcedRefreshReuseSeconds = 5.0
    /// When the last cycle ended with new tokens (monotonic).
    var lastRenewalAt = -Double.infinity
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

    /// `invalid_dpop_proof` (RFC 9449 §5) too: the client's proof was refused before the grant was looked at (an
    /// alg policy, a clock apart), so the refresh token is fine and a new login would be refused the same way.
    static let clientRefusalErrors: Set<String> = ["invalid_client", "unauthorized_client", dpopProofRefusal]
    static let dpopProofRefusal = "invalid_dpop_proof"

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

    func tokenNeedsReplacing(_ now: Instant) -> Bool {
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

    // MARK: - Plumbing

    mutating func emit(_ action: Action) { actions.append(action) }

    mutating func log(_ level: LogLevel, _ message: String, _ metadata: [String: String] = [:]) {
        emit(.log(level, message, metadata))
    }

    mutating func drain() -> [Action] {
        defer { actions = [] }
        return actions
    }
}
