import FoundationEssentials
import Glibc

/// The token set of a fleet in Redis, with the refresh lock and update announcements.
///
/// Layout under `key`: a hash `<key>` with `version` (grows by one with every write), `tokens` (the
/// token file's JSON) and `login_required` (why, when the token server refused the refresh token);
/// the lock `<key>:lock` (owner id, expiry); updates published on `<key>:updates` (the new version).
///
/// Rules, each with the race it prevents:
/// - Writes are compare-and-set on the version (`RedisScripts.compareAndSet`): a writer whose base is
///   stale (its lock expired, an operator imported meanwhile) can never overwrite a newer rotation.
/// - The lock is `SET NX PX` with our owner id and released by compare-and-delete: a holder whose lock
///   expired cannot delete the next holder's lock.
/// - `lockValidUntil` counts from the moment the SET left, so it never overstates the lock's life.
/// - Updates are published in the same script as the write, so no write goes unannounced; the version
///   is also polled (`startPolling`), which carries the announcements while the subscription is down, and
///   a new subscription looks once (messages published while it was down are lost).
///
/// Two connections: commands, and the subscription (a subscribed connection takes no other commands).
/// Confined to the event loop.
final class RedisTokenStore: TokenStore {
    let settings: RedisSettings
    /// The value's (de)serialisation: plain JSON, or sealed with `tokens.encryption` (bound to this key).
    var codec = TokenStateCodec.plain
    /// The node in use: the `url`'s, or the master the sentinels named last (`sentinel`).
    private(set) var endpoint: RedisEndpoint
    /// With `tokens.redis.sentinel`: finds the master before every connect and announces failovers.
    let sentinel: RedisSentinelLocator?
    /// Who holds the lock, for /status on every relay (host, pid and a random part; never a secret).
    let ownerID: String
    let loop: EventLoop  // internal (was private): the Watch and Lock extensions schedule on it
    /// The life each `SET NX PX` gives the lock. Follows reloads of `timeouts.refresh_seconds` and
    /// `lock_seconds` (`useLockLifetime`): fixed at start, a raised refresh_seconds would leave every lock
    /// too short to cover a refresh, and the relay would refuse to refresh until restarted.
    var lockSeconds: Double  // internal set (was private(set)): set by useLockLifetime in RedisTokenStore+Lock.swift

    /// Internal (not private) for the Sentinel extension (`RedisTokenStore+Sentinel.swift`), as are
    /// `reconnectTimer`, `reconnectDelay`, `connect()` and `lost(_:)`.
    var commands: RedisConnection?
    var subscriber: RedisConnection?  // internal (was private): RedisTokenStore+Watch.swift
    var reconnectTimer: LoopEvent?
    var pollTimer: LoopEvent?  // internal (was private): RedisTokenStore+Watch.swift
    var reconnectDelay = 0.1
    private(set) var isConnected = false
    var isSubscribed = false  // internal set (was private(set)): RedisTokenStore+Watch.swift
    private(set) var outage: String? = "connecting"

    /// The version the tokens in service came from (a write's expected version).
    var baseVersion: Int64 = 0  // internal set (was private(set)): the Read and Write extensions
    var lastReadVersion: Int64 = 0  // internal (was private): the Watch, Read and Write extensions
    var announcedVersion: Int64 = 0  // internal (was private): the Watch, Read and Write extensions
    /// The highest version this relay wrote or adopted, as stored: what is put back when Redis turns out to
    /// hold a lower version of its lineage (`putBack`, `RedisHeldSet`).
    var held: RedisHeldSet?  // internal (was private): the Watch, Read and Write extensions
    // Internal (was private): the Read and Write extensions.
    var lastRead: (value: Data, loginRequired: String, importStamp: Int64?)?
    var puttingBack = false  // internal (was private): RedisTokenStore+Read.swift
    var writesPutBack = 0  // internal set (was private(set)): RedisTokenStore+Read.swift
    /// When a read first found the key gone after this relay had seen a version (`emptyStore`).
    var dataLossNoticedAt: Double?  // internal (was private): the Read and Write extensions
    /// The lock's holder as last seen (a read also looks at the lock).
    var lockHolder: String?  // internal set (was private(set)): the Read and Lock extensions

    var holdsLock = false  // internal (was private): RedisTokenStore+Lock.swift
    var lockValidUntil: Double?  // internal set (was private(set)): RedisTokenStore+Lock.swift
    var acquisition: Acquisition?  // internal (was private): RedisTokenStore+Lock.swift

    struct Acquisition {  // internal (was private): RedisTokenStore+Lock.swift
        var deadline: Double
        var waited: Bool
        var completion: (Bool, Bool) -> Void
        var retry: LoopEvent?
    }

    var onChange: (() -> Void)?
    /// Counted events for /metrics (wired by the coordinator).
    var onCount: ((RedisStoreCount) -> Void)?
    /// A write put back (for the log; never a token).
    var onPutBack: ((String) -> Void)?
    /// The sealed `dpop_key` field value of the key this relay signs with, when it is kept in the record
    /// (`DPoPFleetKey`, no `dpop.key_file`): every write stores it if the field is missing (HSETNX), so a
    /// record that lost it converges on the key the fleet's tokens are bound to, not on the key of the next
    /// relay to start. `onDPoPKeyStored` is told when a write stored it again.
    var dpopKeyField: Data?
    var onDPoPKeyStored: (() -> Void)?
    /// An operator's import followed instead of put back over (for the log; never a token).
    var onImportFollowed: ((String) -> Void)?
    private(set) var readOnlyReplies = 0
    var onReachability: ((String?) -> Void)?
    /// A failover followed through the sentinels (for the log).
    var onFailoverFollowed: ((String) -> Void)?
    /// The `+switch-master` subscription lost, with the reason; the next sentinel is tried (for the log).
    var onSentinelWatchLost: ((String) -> Void)?
    var sentinelState = RedisSentinelState()

    /// How often a contended lock is tried again: well below the adoption goal, cheap for Redis.
    static let lockRetryInterval = 0.05

    init(loop: EventLoop, settings: RedisSettings, endpoint: RedisEndpoint, refreshSeconds: Double, sentinel: RedisSentinelLocator? = nil) {
        self.loop = loop
        self.sentinel = sentinel
        self.settings = settings
        self.endpoint = endpoint
        lockSeconds = settings.effectiveLockSeconds(refreshSeconds: refreshSeconds)
        var host = [CChar](repeating: 0, count: 256)
        gethostname(&host, host.count - 1)
        ownerID = "\(String(cString: host))/\(getpid())/\(String(UInt32.random(in: 0...UInt32.max), radix: 16))"
    }

    var name: String { settings.key }
    var kind: String { "redis" }
    var isShared: Bool { true }
    var lockKey: String { settings.key + ":lock" }
    var channel: String { settings.key + ":updates" }

    // MARK: - Connections

    func start() {
        if let sentinel {
            sentinel.onSwitch = { [weak self] from, to in self?.sentinelsSwitched(from: from, to: to) }
            sentinel.onWatchLost = { [weak self] reason in self?.onSentinelWatchLost?(reason) }
            sentinel.startWatching()
        }
        connect()
    }

    func connect() {
        reconnectTimer = nil
        guard let sentinel else { return open() }
        // Asked before every connect: a failed connection, a READONLY or a ROLE that says replica may all
        // mean the master moved, and the sentinels know where.
        sentinel.locate { [weak self] result in
            guard let self, self.commands == nil else { return }
            switch result {
            case .success(let master):
                self.endpoint = master
                self.open()
            case .failure(let error):
                self.lost(error.description)
            }
        }
    }

    private func open() {
        let connection = RedisConnection(loop: loop, endpoint: endpoint, commandTimeout: settings.commandTimeoutSeconds)
        commands = connection
        connection.onClosed = { [weak self, weak connection] reason in
            guard let self, let connection, self.commands === connection else { return }
            self.lost(reason)
        }
        connection.open { [weak self, weak connection] error in
            guard let self, let connection, self.commands === connection else { return }
            if let error { return self.lost(error) }
            self.confirmMaster(connection)
        }
    }

    /// `ROLE` before the store counts as connected. Race it prevents: a `url` that names a node turned
    /// replica (the old master back after a failover) reads fine, so the relay would report ready and
    /// serve until the first write, then fail every refresh with nothing saying why.
    private func confirmMaster(_ connection: RedisConnection) {
        connection.send(["ROLE"]) { [weak self, weak connection] result in
            guard let self, let connection, self.commands === connection else { return }
            switch result {
            case .failure(let error): return self.lost(error.description)
            case .success(let reply):
                if case .notMaster(let role) = RedisRole.parse(reply) {
                    return self.notWritable("the node is a \(role), not the master (ROLE); writes cannot land there")
                }
            }
            self.isConnected = true
            if self.sentinel != nil { self.noteMaster() }
            self.notWritableReason = nil
            self.reconnectDelay = 0.1
            self.outage = nil
            self.subscribe()
            self.onReachability?(nil)
        }
    }

    /// `READONLY` to a write: the node became a replica under us (a failover). Unavailable with that
    /// reason, and reconnect (with `ROLE` at connect) until it, or the one the configuration leads to, is
    /// the master again.
    // Internal (was private): the Read, Write and Lock extensions.
    func noticedReadOnly(_ reply: RedisReply) -> Bool {
        guard RedisRole.isReadOnlyError(reply) else { return false }
        readOnlyReplies += 1
        onCount?(.readOnlyReply)
        notWritable("the node answered READONLY: it is a replica now; writes cannot land there")
        return true
    }

    /// Why the node reached is no master, while that is why the store is unavailable: unlike an
    /// unreachable Redis, not ready even while the token in hand works (`url` leads nowhere writable
    /// until an operator or a failover changes that).
    private(set) var notWritableReason: String?

    // Internal (was private): RedisTokenStore+Watch.swift.
    func notWritable(_ reason: String) {
        lost(reason)
        if notWritableReason == nil { lastDemotionSeen = Date() }
        notWritableReason = outage
    }

    /// When the node was last found no master (a failover or a REPLICAOF seen from here), for /status.
    private(set) var lastDemotionSeen: Date?

    /// The command connection failed: unreachable until a new one answers. A lock we held expires by
    /// itself; a lock wait ends now (unacquired).
    func lost(_ reason: String) {
        commands?.close()
        commands = nil
        subscriber?.close()
        subscriber = nil
        isConnected = false
        isSubscribed = false
        pollTimer = nil
        // A `SET` of an acquisition may sit unanswered in a stalled Redis that runs it later: the lock may
        // be ours then, without a reply to say so (`tryLock` clears it before the next acquisition).
        if holdsLock || acquisition != nil { lockMayLinger = true }
        holdsLock = false
        lockValidUntil = nil
        let previous = outage
        outage = "Redis \(nodeDescription): \(reason)"
        if let pending = acquisition {
            acquisition = nil
            pending.completion(false, pending.waited)
        }
        // Told once per new reason: at start the placeholder ("connecting") gives way to the real one, and
        // a Redis that stays down with the same error does not repeat itself every reconnect.
        if outage != previous { onReachability?(outage) }
        let timer = LoopEvent(loop: loop) { [weak self] _ in self?.connect() }
        timer.schedule(after: reconnectDelay)
        reconnectTimer = timer
        reconnectDelay = min(reconnectDelay * 2, sentinel == nil ? 2 : RedisSentinelLocator.longestReconnectDelay)
        sentinel?.askAnotherFirst()
    }

    /// A lock we held when the connection failed may still be in Redis (on a promoted replica after a
    /// failover, replicated with its expiry): deleted (compare-and-delete, so only if still ours) at the
    /// next release, once the answer it covered is stored. Race it prevents: the fleet waiting out a
    /// lock whose holder already finished, its refresh answer written by the retry; with short tokens
    /// that wait turned into 401s and seconds of 503s after a failover.
    var lockMayLinger = false  // internal (was private): RedisTokenStore+Lock.swift

    /// The in-flight record as last read or written (`RedisTokenStore+InFlight.swift`).
    var inFlightRead = RefreshInFlightRead.none  // internal (was private): RedisTokenStore+InFlight.swift

    /// Failures answered without asking Redis still arrive from the loop, like replies do, never inside
    /// the call that asked.
    // Internal (was private): the Read, Write and Lock extensions.
    func deferred(_ work: @escaping () -> Void) {
        deferredWork.append(work)
        if deferredEvent == nil {
            deferredEvent = LoopEvent(loop: loop) { [weak self] _ in
                guard let self else { return }
                let due = self.deferredWork
                self.deferredWork = []
                due.forEach { $0() }
            }
        }
        deferredEvent?.activate()
    }

    private var deferredWork: [() -> Void] = []
    private var deferredEvent: LoopEvent?
}

enum RedisStoreCount {
    case readOnlyReply
    case writePutBack
    case failoverFollowed
}

struct RedisStoreError: Error, CustomStringConvertible {
    let description: String
}
