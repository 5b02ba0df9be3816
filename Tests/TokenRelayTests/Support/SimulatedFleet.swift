import Foundation
@testable import TokenRelay

/// Several `RefreshMachine`s sharing one simulated Redis, driven the way `RefreshCoordinator` and
/// `RedisTokenStore` drive them, on one manual clock: the fleet's refresh rules in milliseconds.
///
/// The store keeps what Redis keeps: a version, the value as the token file's JSON (encoded and decoded
/// by the real `TokenFile`, so the stored expiry has the precision a relay really reads back), the lock
/// (`SET NX PX`, retried every 50 ms), the in-flight record, and announcements of every write. The token
/// server rotates the refresh token on every refresh and counts a presented burnt one as reuse; the
/// upstream accepts only the newest access token while it has not expired (as `FakeTokenServer` does).
/// Steady load: every relay sends one request every `requestInterval`.
final class SimulatedFleet {
    typealias Machine = RefreshMachine

    var redisLatency = 0.001
    var tokenEndpointLatency = 0.03
    var announceLatency = 0.002
    var pollInterval = 0.1
    var requestInterval = 0.02
    var lockSeconds = 4.0
    let accessTokenLifetime: Double

    /// The stored expiry with milliseconds, as `RedisTokenStore` writes it (false: whole seconds, as before).
    var storedExpiryMilliseconds = true

    private(set) var clock = 0.0
    /// The wall clock's fraction of a second at zero: where the token file's whole seconds cut.
    let wallAtZero: Date
    var wall: Date { wallAtZero.addingTimeInterval(clock) }

    // The store.
    private(set) var version: Int64 = 1
    private(set) var value: Data
    private var lock: (owner: Int, until: Double)?
    private var inFlight = RefreshInFlightRead.none

    // The token server and the upstream.
    private var currentRefresh = "refresh-0"
    private var currentAccess = "access-0"
    private var accessExpiresAt: Double
    private var serial = 0
    private(set) var refreshes = 0
    private(set) var reuse = 0
    private(set) var answers: [Int: Int] = [:]

    private(set) var relays: [SimulatedRelay] = []
    private var events: [(at: Double, order: Int, work: () -> Void)] = []
    private var order = 0
    private var randomState: UInt64 = 0x9E37_79B9_7F4A_7C15

    init(relays count: Int, accessTokenLifetime: Double = 2, wallFraction: Double = 0.25, olderAccessTokensStayValid: Bool = false) {
        self.olderAccessTokensStayValid = olderAccessTokensStayValid
        wallAtZero = Date(timeIntervalSince1970: 1_800_000_000 + wallFraction)
        self.accessTokenLifetime = accessTokenLifetime
        accessExpiresAt = accessTokenLifetime
        let initial = TokenSet(accessToken: "access-0", refreshToken: "refresh-0",
                               expiresAt: wallAtZero.addingTimeInterval(accessTokenLifetime))
        value = (try? TokenFile.encode(initial, expiryMilliseconds: true)) ?? Data()
        for index in 0..<count { relays.append(SimulatedRelay(fleet: self, index: index)) }
        for relay in relays { relay.start() }
    }

    /// Runs every event due until `end` (seconds on the fleet's clock).
    func run(until end: Double) {
        while let next = events.last, next.at <= end {
            events.removeLast()
            clock = max(clock, next.at)
            next.work()
        }
        clock = end
    }

    /// Kept sorted latest first, so the next event is the last one.
    func after(_ delay: Double, _ work: @escaping () -> Void) {
        order += 1
        let event = (at: clock + max(0, delay), order: order, work: work)
        var low = 0, high = events.count
        while low < high {
            let middle = (low + high) / 2
            if (events[middle].at, events[middle].order) > (event.at, event.order) { low = middle + 1 } else { high = middle }
        }
        events.insert(event, at: low)
    }

    /// Uniform in 0...1, the same sequence every run.
    func nextJitter() -> Double {
        randomState = randomState &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        return Double(randomState >> 11) / Double(UInt64(1) << 53)
    }

    func now() -> Machine.Instant { Machine.Instant(monotonic: clock, wall: wall, jitter: nextJitter()) }

    // MARK: - Redis

    func read() -> (Machine.StoreRead, Int64) {
        do {
            return (.tokens(try TokenFile.decode(value, path: "redis:simulated")), version)
        } catch {
            return (.unreadable("\(error)"), version)
        }
    }

    var inFlightRecord: RefreshInFlightRead { inFlight }

    func setInFlight(_ record: RefreshInFlightRead) { inFlight = record }

    func tryLock(_ owner: Int) -> Double? {
        if let lock, lock.until > clock { return nil }
        lock = (owner, clock + lockSeconds)
        return clock + lockSeconds
    }

    func unlock(_ owner: Int) {
        if lock?.owner == owner { lock = nil }
    }

    /// The compare-and-set: the new version, or nil when `expected` is stale.
    func compareAndSet(expected: Int64, _ tokens: TokenSet) -> Int64? {
        guard expected == version, let data = try? TokenFile.encode(tokens, expiryMilliseconds: storedExpiryMilliseconds) else { return nil }
        version += 1
        value = data
        let announced = version
        for relay in relays { after(announceLatency) { relay.announced(announced) } }
        return version
    }

    // MARK: - Token server and upstream

    /// Who refreshed when (for a failure's message).
    private(set) var refreshLog: [(at: Double, relay: Int)] = []
    var refreshers: Set<Int> { Set(refreshLog.map(\.relay)) }

    func tokenEndpoint(_ presented: String?, from relay: Int = -1) -> TokenEndpointResult {
        refreshLog.append((clock, relay))
        guard let presented, presented == currentRefresh else {
            reuse += 1
            return .rejected(status: 400, oauthError: "invalid_grant")
        }
        serial += 1
        refreshes += 1
        currentRefresh = "refresh-\(serial)"
        currentAccess = "access-\(serial)"
        accessExpiresAt = clock + accessTokenLifetime
        expiryOfAccessToken[currentAccess] = accessExpiresAt
        return .granted(TokenGrant(accessToken: currentAccess, refreshToken: currentRefresh, expiresIn: accessTokenLifetime))
    }

    /// Every access token issued, until it expires (most APIs: a JWT is valid until its `exp`), or only the
    /// newest (a server that revokes the old access token with the rotation, as `FakeTokenServer` does).
    var olderAccessTokensStayValid = false
    private var expiryOfAccessToken: [String: Double] = [:]

    func upstreamAccepts(_ accessToken: String) -> Bool {
        if olderAccessTokensStayValid { return clock < (expiryOfAccessToken[accessToken] ?? accessTokenLifetime) }
        return accessToken == currentAccess && clock < accessExpiresAt
    }

    func count(answer status: Int) { answers[status, default: 0] += 1 }
}
