import FoundationEssentials

/// What goes into the refresh machine and what comes out of it. No I/O and no event loop here: the
/// driver (`RefreshCoordinator`) turns events of the outside world into these, and these actions into
/// effects.
extension RefreshMachine {
    /// The machine's clock and dice, passed in with every event so that tests can run it with a manual
    /// clock: `monotonic` for timers and spacing, `wall` for token expiry (which is a calendar time in
    /// the token file), `jitter` a uniform number in 0...1 for the spreads (0.5 means "no jitter").
    struct Instant {
        var monotonic: Double
        var wall: Date
        var jitter: Double = 0.5
    }

    /// The rules' knobs: `refresh.*` plus the timeouts the rules depend on. A cycle keeps the settings it
    /// started with (live reload applies them from the next cycle).
    struct Settings: Equatable {
        var maxAttempts = 4
        var backoffSeconds = 0.5
        var proactive = true
        var skewSeconds: Double?
        var stormMaxRefreshes = 5
        var stormWindowSeconds = 30.0
        /// `timeouts.refresh_seconds`: how long after sending a refresh request the server may still be
        /// working on it.
        var refreshTimeout = 60.0
        /// How long a cycle waits for the cross-process lock.
        var lockTimeout = 180.0
        /// Whether the grant presents a refresh token (client credentials does not).
        var needsRefreshToken = true
        /// How long a write to the store may take once the token server has answered (a shared store's
        /// command timeout; 0 for the file): the refresh lock must outlive it too.
        var storeWriteTimeout = 0.0
        /// The store is shared by a fleet (Redis): a read that fails under the lock stops the attempt.
        var sharedStore = false

        init() {}

        init(_ refresh: Config.Refresh, refreshTimeout: Double, lockTimeout: Double, needsRefreshToken: Bool) {
            maxAttempts = refresh.maxAttempts
            backoffSeconds = refresh.backoffSeconds
            proactive = refresh.proactive
            skewSeconds = refresh.skewSeconds
            stormMaxRefreshes = refresh.stormMaxRefreshes
            stormWindowSeconds = refresh.stormWindowSeconds
            self.refreshTimeout = refreshTimeout
            self.lockTimeout = lockTimeout
            self.needsRefreshToken = needsRefreshToken
        }
    }

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

    enum Trigger: String {
        case unauthorized, forced, expiring, expired
        case noToken = "no_token"
    }

    enum Outcome: Equatable {
        case renewed(generation: UInt64)
        /// The token endpoint refused: a new login is needed.
        case rejected
        /// No new token could be obtained for now (transient failures exhausted, or an unusable answer).
        case unavailable(reason: String)
    }

    /// What a request that just got a refresh-triggering status should do.
    enum UnauthorizedDecision: Equatable {
        case replay
        case hold
        case passThrough
        /// No refresh may start now (the refresh hold-off): 503 with this `Retry-After`.
        case unavailable(retryAfter: Int)
        /// Refreshing has stopped (shutdown, or a reload removed the identity) and no cycle is running to
        /// release a hold: 503 at once.
        case noRefresh
    }

    /// What a request that just arrived should do. `send` carries the generation; the driver adds the
    /// header value.
    enum Admission: Equatable {
        case send(generation: UInt64)
        case hold
        case loginRequired
        /// The access token is dead and no refresh may start now (the refresh hold-off).
        case unavailable(retryAfter: Int)
    }

    /// The machine's timers; at most one of each kind is armed.
    enum Timer: Hashable, CaseIterable {
        /// The cycle's next attempt (its first, a backoff, a `Retry-After`).
        case attempt
        case proactive
        case stormRecovery
        case holdOff
        case saveRetry
    }

    /// The token store as read by the driver (under the lock, or when the watch saw a change).
    enum StoreRead {
        case tokens(TokenSet)
        /// A shared store holding no token set yet.
        case empty
        /// The stored tokens were refused by the token server (by any relay): login required, fleet-wide.
        case latched(TokenSet, reason: String)
        case unreadable(String)
        /// The token file holds a sealed state this relay cannot open (another key, a failed tag): it may hold
        /// a rotation newer than ours, so our refresh token is not presented over it nor the file overwritten.
        case sealedUnopened(String)
    }

    enum Metric: Equatable {
        case cycleStarted(Trigger)
        case refreshOutcome(String)
        case refreshError(code: String)
        case refreshDuration(Double)
        case adoptedRotation
        case stormGuardTrip
        case tokenFileWriteFailure
        /// A write lost its compare-and-set to a newer stored version.
        case storeConflict
    }

    enum LogLevel { case debug, info, warning, error, critical }

    enum Action {
        case schedule(Timer, at: Double)
        case cancel(Timer)
        case acquireLock(timeout: Double)
        case releaseLock
        /// Write the in-flight record durably; answer with `inFlightRecorded` or `inFlightRecordFailed`.
        case recordInFlight(RefreshInFlightRecord)
        /// Remove the in-flight record (at once, before the lock is released).
        case removeInFlightRecord
        /// One exchange with the token endpoint for these tokens (the grant decides what it presents).
        case presentRefreshToken(TokenSet)
        /// Write these tokens to the store; answer with `persisted` or `persistFailed`.
        case persist(TokenSet)
        /// Read the store now and answer with `storeRead` (the hold-off's end).
        case readStore
        /// Store "login required" with the token set, for every relay sharing the store (a file store
        /// has nothing to do: its own process has latched already).
        case latchLoginRequired(String)
        /// Release every held request with this outcome, and answer waiting forced refreshes.
        case release(Outcome)
        /// New secrets to keep out of every log line.
        case redact([String?])
        case count(Metric)
        case log(LogLevel, String, [String: String])
        /// The machine's gauges changed (generation, expiry, login required, unsaved tokens).
        case publish
        /// An exchange with the token endpoint or a write of its tokens ended (a draining shutdown waits
        /// for this).
        case tokenEndpointIdle
    }
}

extension RefreshMachine.Action: Equatable {
    static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case let (.schedule(a, x), .schedule(b, y)): return a == b && x == y
        case let (.cancel(a), .cancel(b)): return a == b
        case let (.acquireLock(a), .acquireLock(b)): return a == b
        case (.releaseLock, .releaseLock), (.readStore, .readStore), (.publish, .publish), (.tokenEndpointIdle, .tokenEndpointIdle),
             (.removeInFlightRecord, .removeInFlightRecord):
            return true
        case let (.recordInFlight(a), .recordInFlight(b)): return a == b
        case let (.presentRefreshToken(a), .presentRefreshToken(b)), let (.persist(a), .persist(b)):
            return a.accessToken == b.accessToken && a.refreshToken == b.refreshToken && a.expiresAt == b.expiresAt
        case let (.release(a), .release(b)): return a == b
        case let (.redact(a), .redact(b)): return a == b
        case let (.latchLoginRequired(a), .latchLoginRequired(b)): return a == b
        case let (.count(a), .count(b)): return a == b
        case let (.log(a, x, _), .log(b, y, _)): return a == b && x == y
        default: return false
        }
    }
}
