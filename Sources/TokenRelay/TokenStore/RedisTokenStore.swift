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
    private let loop: EventLoop
    /// The life each `SET NX PX` gives the lock. Follows reloads of `timeouts.refresh_seconds` and
    /// `lock_seconds` (`useLockLifetime`): fixed at start, a raised refresh_seconds would leave every lock
    /// too short to cover a refresh, and the relay would refuse to refresh until restarted.
    private(set) var lockSeconds: Double

    /// Internal (not private) for the Sentinel extension (`RedisTokenStore+Sentinel.swift`), as are
    /// `reconnectTimer`, `reconnectDelay`, `connect()` and `lost(_:)`.
    var commands: RedisConnection?
    private var subscriber: RedisConnection?
    var reconnectTimer: LoopEvent?
    private var pollTimer: LoopEvent?
    var reconnectDelay = 0.1
    private(set) var isConnected = false
    private(set) var isSubscribed = false
    private(set) var outage: String? = "connecting"

    /// The version the tokens in service came from (a write's expected version).
    private(set) var baseVersion: Int64 = 0
    private var lastReadVersion: Int64 = 0
    private var announcedVersion: Int64 = 0
    /// The highest version this relay wrote or adopted, as stored: what is put back when Redis turns out to
    /// hold a lower version of its lineage (`putBack`, `RedisHeldSet`).
    private var held: RedisHeldSet?
    private var lastRead: (value: Data, loginRequired: String, importStamp: Int64?)?
    private var puttingBack = false
    private(set) var writesPutBack = 0
    /// When a read first found the key gone after this relay had seen a version (`emptyStore`).
    private var dataLossNoticedAt: Double?
    /// The lock's holder as last seen (a read also looks at the lock).
    private(set) var lockHolder: String?

    private var holdsLock = false
    private(set) var lockValidUntil: Double?
    private var acquisition: Acquisition?

    private struct Acquisition {
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
    private func noticedReadOnly(_ reply: RedisReply) -> Bool {
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

    private func notWritable(_ reason: String) {
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
        if holdsLock { lockMayLinger = true }
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

    private func subscribe() {
        let connection = RedisConnection(loop: loop, endpoint: endpoint, commandTimeout: settings.commandTimeoutSeconds)
        subscriber = connection
        connection.onPush = { [weak self] message in
            guard let self, case .array(let parts) = message, parts.count == 3, parts[0].text == "message",
                  let version = parts[2].integer else { return }
            self.announced(version)
        }
        connection.onClosed = { [weak self, weak connection] _ in
            guard let self, let connection, self.subscriber === connection else { return }
            self.subscriptionDropped()
        }
        connection.open { _ in }
        connection.send(["SUBSCRIBE", channel]) { [weak self, weak connection] result in
            guard let self, let connection, self.subscriber === connection else { return }
            guard case .success(.array) = result else { return self.subscriptionDropped() }
            self.isSubscribed = true
            // Anything published while we were not subscribed is lost: look once.
            self.pollVersion()
        }
        startPolling()
    }

    /// The subscription failed: polling (always on) carries the announcements until it is back, and it
    /// is tried again meanwhile.
    private func subscriptionDropped() {
        subscriber?.close()
        subscriber = nil
        isSubscribed = false
        guard isConnected else { return }
        startPolling()
        let timer = LoopEvent(loop: loop) { [weak self] _ in
            guard let self, self.isConnected, self.subscriber == nil else { return }
            self.subscribe()
        }
        timer.schedule(after: 1)
        reconnectTimer = timer
    }

    /// The version is polled every `poll_interval_seconds` while connected, subscribed or not: it carries
    /// the announcements while the subscription is down, catches a message lost in a reconnect, and makes
    /// a Redis that went silent without closing the connection (a network partition) show up as
    /// unreachable within a command timeout instead of at the next refresh.
    private func startPolling() {
        guard pollTimer == nil else { return }
        let timer = LoopEvent.repeating(loop: loop) { [weak self] in self?.pollVersion() }
        timer.schedule(after: settings.pollIntervalSeconds)
        pollTimer = timer
    }

    private func pollVersion() {
        // The role rides along: a master demoted under us (the old master rejoining after a failover, an
        // operator's REPLICAOF) shows up within a poll, not at the next write.
        commands?.send(["ROLE"]) { [weak self] result in
            guard let self, case .success(let reply) = result, case .notMaster(let role) = RedisRole.parse(reply) else { return }
            self.notWritable("the node is a \(role) now, not the master (ROLE); writes cannot land there")
        }
        commands?.send(["HGET", settings.key, "version"]) { [weak self] result in
            guard let self, case .success(let reply) = result, let version = reply.integer else { return }
            self.announced(version)
        }
    }

    private func announced(_ version: Int64) {
        // Lower than ours: a read decides (`decode`) whether it is a lost write or an operator's new import.
        if let held, version < held.version {
            onChange?()
            return
        }
        announcedVersion = max(announcedVersion, version)
        if changeSinceLastLook() { onChange?() }
    }

    // MARK: - TokenStore

    func changeSinceLastLook() -> Bool {
        announcedVersion > max(baseVersion, lastReadVersion)
    }

    func read(completion: @escaping (RefreshMachine.StoreRead) -> Void) {
        guard let commands, isConnected else { return deferred { completion(.unreadable(self.outage ?? "Redis is not connected")) } }
        commands.send(["GET", lockKey]) { [weak self] result in
            if case .success(let reply) = result { self?.lockHolder = reply.text }
        }
        readInFlight(commands)
        commands.send(["HMGET", settings.key, "version", "tokens", "login_required", "imported_at"]) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error): completion(.unreadable(error.description))
            case .success(let reply): completion(self.decode(reply))
            }
        }
    }

    private func decode(_ reply: RedisReply) -> RefreshMachine.StoreRead {
        guard case .array(let fields) = reply, fields.count == 4 else {
            if case .error(let message) = reply { return .unreadable("Redis: \(message)") }
            return .unreadable("unexpected reply from Redis")
        }
        guard let version = fields[0].integer else { return emptyStore() }
        switch held?.verdict(storedVersion: version, storedImportStamp: fields[3].integer) {
        case .putBack?:
            putBack(over: version)
            return .unreadable("Redis key \(settings.key) holds version \(version), lower than version \(held?.version ?? 0) this relay "
                + "wrote or adopted (a write lost in a failover); writing the newer token set back before anyone refreshes")
        case .newerImport?:
            onImportFollowed?("Redis key \(settings.key) holds version \(version) from an import newer than version \(held?.version ?? 0) this "
                + "relay held (a flush, then an import); adopting it instead of putting ours back")
            held = nil
            announcedVersion = version
        case .current?, nil:
            // A latched set is not put back: Redis's lower version is followed from here on.
            if let held, version < held.version {
                self.held = nil
                announcedVersion = version
            }
        }
        dataLossNoticedAt = nil
        lastReadVersion = version
        announcedVersion = max(announcedVersion, version)
        guard case .string(let data) = fields[1] else { return .unreadable("Redis key \(settings.key) has a version but no tokens") }
        lastRead = (data, fields[2].text ?? "", fields[3].integer)
        let tokens: TokenSet
        do {
            tokens = try codec.decode(data, name: "redis:\(settings.key)")
        } catch {
            return .unreadable("\(error)")
        }
        if let reason = fields[2].text, !reason.isEmpty { return .latched(tokens, reason: reason) }
        return .tokens(tokens)
    }

    /// Rule (the race it prevents: Redis restarts empty, or is flushed, while another relay's refresh is at
    /// the token server; the lock, the fleet's only record of that refresh, went with the data, so a relay
    /// that needs a token takes a fresh lock, finds nothing newer and presents the same refresh token, and a
    /// rotation server revokes the session): a relay that has seen a version and now finds none presents
    /// nothing until a lock taken before the loss would have expired, `lockSeconds` from noticing it. The
    /// refresher's write, which an absent key accepts, is adopted meanwhile. A store this relay never saw
    /// with data (a first start) is only new.
    private func emptyStore() -> RefreshMachine.StoreRead {
        guard max(baseVersion, lastReadVersion, announcedVersion) > 0 else { return .empty }
        let now = EventLoop.monotonicNow
        let noticed = dataLossNoticedAt ?? now
        dataLossNoticedAt = noticed
        let left = noticed + lockSeconds - now
        guard left > 0 else { return .empty }
        return .unreadable("Redis key \(settings.key) lost its data (a restarted or flushed Redis); a refresh begun before the loss "
            + "may still be in progress, so no refresh token is presented for \(cFormat("%.1f", left)) s")
    }

    func noteAdopted() {
        baseVersion = lastReadVersion
        if let lastRead, lastReadVersion >= (held?.version ?? 0) {
            held = RedisHeldSet(version: lastReadVersion, value: lastRead.value, loginRequired: lastRead.loginRequired, importStamp: lastRead.importStamp)
        }
    }

    /// Rule (the race it prevents: a failover promoted a replica that never received our last write, or
    /// one we adopted; the next relay to refresh would present the refresh token that write's rotation
    /// burnt, and a rotation server revokes the fleet's session): Redis holding a lower version than one
    /// this relay wrote or adopted gets that newer token set back, by the compare-and-set on the version it
    /// holds now. Until then reads answer unreadable, so nothing is presented or adopted. A latched set
    /// ("login required") is never put back, nor one over an operator's newer import (`RedisHeldSet`).
    private func putBack(over stored: Int64) {
        guard let held, !puttingBack, let commands, isConnected else { return }
        puttingBack = true
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: channel, expected: stored, tokens: held.value,
                                                            loginRequired: held.loginRequired, writer: ownerID)
        commands.send(arguments) { [weak self] result in
            guard let self else { return }
            self.puttingBack = false
            guard case .success(let reply) = result, !self.noticedReadOnly(reply),
                  case .written(let version) = RedisScripts.compareAndSetOutcome(reply) else { return }
            self.writesPutBack += 1
            self.onCount?(.writePutBack)
            self.onPutBack?("Redis held version \(stored), lower than version \(held.version) this relay had seen; wrote it back as version \(version)")
            self.baseVersion = version
            self.lastReadVersion = version
            self.announcedVersion = version
            self.held?.version = version
        }
    }

    var version: Int64 { baseVersion }

    /// The import stamp of the record the next write replaces (what its mark in the local cache names).
    var lineageImportStamp: Int64? { lastRead?.importStamp ?? held?.importStamp }

    /// A token set from the local cache that Redis never acknowledged (`UnacknowledgedWriteMark`): held as the
    /// version past the one its write expected, so that Redis answering with that version (or a lower one of
    /// the same lineage) gets it written back (`putBack`).
    func holdUnacknowledged(_ tokens: TokenSet, _ mark: UnacknowledgedWriteMark.Mark) throws {
        // Clamped: the mark is read from a file, and its largest version must not trap.
        held = RedisHeldSet(version: min(mark.overVersion, Int64.max - 1) + 1, value: try codec.encode(tokens, expiryMilliseconds: true),
                            loginRequired: "", importStamp: mark.importStamp)
    }

    func write(_ tokens: TokenSet, completion: @escaping (TokenStoreWrite) -> Void) {
        compareAndSet(tokens, loginRequired: nil, completion: completion)
    }

    func latchLoginRequired(_ tokens: TokenSet, reason: String) {
        compareAndSet(tokens, loginRequired: reason) { _ in }
    }

    /// Persist before release: answers `written` only once Redis acknowledged the script.
    private func compareAndSet(_ tokens: TokenSet, loginRequired: String?, completion: @escaping (TokenStoreWrite) -> Void) {
        guard let commands, isConnected else { return deferred { completion(.failed(self.outage ?? "Redis is not connected")) } }
        let data: Data
        do {
            data = try codec.encode(tokens, expiryMilliseconds: true)
        } catch {
            return deferred { completion(.failed("\(error)")) }
        }
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: channel, expected: baseVersion, tokens: data,
                                                            loginRequired: loginRequired ?? "", writer: ownerID)
        commands.send(arguments) { [weak self] result in
            guard let self else { return }
            switch result {
            case .failure(let error): completion(.failed(error.description))
            case .success(let reply):
                if self.noticedReadOnly(reply) { return completion(.failed(self.outage ?? "READONLY")) }
                switch RedisScripts.compareAndSetOutcome(reply) {
                case .written(let version):
                    self.held = RedisHeldSet(version: version, value: data, loginRequired: loginRequired ?? "",
                                             importStamp: self.lastRead?.importStamp ?? self.held?.importStamp)
                    self.dataLossNoticedAt = nil
                    self.baseVersion = version
                    self.lastReadVersion = version
                    self.announcedVersion = max(self.announcedVersion, version)
                    self.awaitReplicas(completion)
                case .conflict:
                    self.read { completion(.conflict($0)) }
                case .failed(let reason):
                    completion(.failed(reason))
                }
            }
        }
    }

    /// `WAIT` narrows what a failover can lose: the new version is on `wait_replicas` replicas before the
    /// write counts as done. Too few in time is a failed write (the tokens stay in service and the write is
    /// retried, as for any failed write).
    private func awaitReplicas(_ completion: @escaping (TokenStoreWrite) -> Void) {
        let wanted = settings.waitReplicas
        guard wanted > 0, let commands else { return completion(.written) }
        let milliseconds = max(1, Int(settings.commandTimeoutSeconds * 500))
        commands.send(["WAIT", String(wanted), String(milliseconds)]) { result in
            switch result {
            case .success(.integer(let count)) where count >= wanted: completion(.written)
            case .success(.integer(let count)):
                completion(.failed("only \(count) of \(wanted) Redis replicas acknowledged the new token set within \(milliseconds) ms"))
            case .success(let other): completion(.failed("WAIT: unexpected reply \(other.text ?? "")"))
            case .failure(let error): completion(.failed(error.description))
            }
        }
    }

    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void) {
        guard isConnected else { return deferred { completion(false, false) } }
        acquisition = Acquisition(deadline: EventLoop.monotonicNow + timeout, waited: false, completion: completion)
        tryLock()
    }

    private func tryLock() {
        guard let commands, acquisition != nil else { return }
        let sentAt = EventLoop.monotonicNow
        let milliseconds = String(Int((lockSeconds * 1000).rounded()))
        commands.send(["SET", lockKey, ownerID, "NX", "PX", milliseconds]) { [weak self] result in
            guard let self, var pending = self.acquisition else {
                // Given up meanwhile (adopted another relay's tokens): let go of a lock we just got.
                if case .success(.status) = result { self?.deleteOwnLock() }
                return
            }
            switch result {
            case .success(.status):
                self.acquisition = nil
                self.holdsLock = true
                self.lockHolder = self.ownerID
                self.lockValidUntil = sentAt + self.lockSeconds
                pending.completion(true, pending.waited)
            case .success(.null):
                guard EventLoop.monotonicNow + Self.lockRetryInterval < pending.deadline else {
                    self.acquisition = nil
                    return pending.completion(false, true)
                }
                pending.waited = true
                let retry = LoopEvent(loop: self.loop) { [weak self] _ in self?.tryLock() }
                retry.schedule(after: Self.lockRetryInterval)
                pending.retry = retry
                self.acquisition = pending
            case .success(let reply) where self.noticedReadOnly(reply):
                break  // `lost` has answered the acquisition
            case .success, .failure:
                // An error reply, or the connection failed (`lost` has answered already if so).
                self.acquisition = nil
                pending.completion(false, pending.waited)
            }
        }
    }

    /// The next `SET` uses it, a retry of a contended acquisition included. A lock we hold keeps its
    /// `lockValidUntil`: its expiry in Redis was set when it was taken, and the refresh machine checks
    /// that life against the exchange it is about to start.
    func useLockLifetime(_ seconds: Double) {
        lockSeconds = seconds
    }

    func release() {
        acquisition = nil
        guard holdsLock || lockMayLinger else { return }
        holdsLock = false
        lockValidUntil = nil
        guard isConnected else { return }
        lockMayLinger = false
        deleteOwnLock()
    }

    /// A lock we held when the connection failed may still be in Redis (on a promoted replica after a
    /// failover, replicated with its expiry): deleted (compare-and-delete, so only if still ours) at the
    /// next release, once the answer it covered is stored. Race it prevents: the fleet waiting out a
    /// lock whose holder already finished, its refresh answer written by the retry; with short tokens
    /// that wait turned into 401s and seconds of 503s after a failover.
    private var lockMayLinger = false

    private func deleteOwnLock() {
        commands?.send(RedisScripts.releaseArguments(lockKey: lockKey, owner: ownerID)) { _ in }
        if lockHolder == ownerID { lockHolder = nil }
    }

    // MARK: - The in-flight refresh record

    /// `<key>:inflight`: the fingerprint of the refresh token being presented and when (never the token).
    /// Rule (the race it prevents: the refreshing relay got its answer but could not write it (Redis
    /// stalled), then died; its lock expires and the next relay, reading the old version, presents the
    /// refresh token that answer burnt): the record is written, and acknowledged, before the refresh token
    /// leaves, and removed only once the answer is stored. A relay that finds one naming the refresh token
    /// in service treats that refresh's outcome as unknown (the hold-off, then "in doubt"), as a token
    /// file's `.refreshing` marker does. Read with every read of the store (`read`), so it is current
    /// under the lock.
    var inFlightKey: String { settings.key + ":inflight" }
    private var inFlightRead = RefreshInFlightRead.none

    func readInFlightRecord() -> RefreshInFlightRead { inFlightRead }

    private func readInFlight(_ commands: RedisConnection) {
        commands.send(["GET", inFlightKey]) { [weak self] result in
            guard let self, case .success(let reply) = result else { return }
            self.inFlightRead = Self.decodeInFlight(reply)
        }
    }

    static func encodeInFlight(_ record: RefreshInFlightRecord) -> String {
        "\(record.fingerprint) \(Int64((record.sentAt.timeIntervalSince1970 * 1000).rounded()))"
    }

    static func decodeInFlight(_ reply: RedisReply) -> RefreshInFlightRead {
        guard let text = reply.text else { return .none }
        let parts = text.split(separator: " ")
        guard parts.count == 2, let milliseconds = Int64(parts[1]) else {
            return .unreadable("unexpected value in the in-flight record", writtenAt: Date())
        }
        return .record(RefreshInFlightRecord(fingerprint: String(parts[0]), sentAt: Date(timeIntervalSince1970: Double(milliseconds) / 1000)))
    }

    /// Off the loop, on a connection of its own: the refresh token leaves only once Redis has the record.
    func inFlightRecordWriter(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void {
        let endpoint = endpoint, timeout = settings.commandTimeoutSeconds * 2, key = inFlightKey
        let value = Self.encodeInFlight(record)
        inFlightRead = .record(record)
        return {
            let reply = try RedisOneShot.run(endpoint: endpoint, timeout: timeout, ["SET", key, value])
            guard case .status = reply else {
                throw RedisStoreError(description: "Redis did not store the in-flight record: \(reply.text ?? "error reply")")
            }
        }
    }

    /// Under the lock, once the answer is stored (or the record names a refresh token no longer in service).
    func removeInFlightRecord() throws {
        inFlightRead = .none
        commands?.send(["DEL", inFlightKey]) { _ in }
    }

    /// At exit the loop has stopped: a short loop of our own carries one compare-and-set.
    func writeAtExit(_ tokens: TokenSet) throws {
        let data = try codec.encode(tokens, expiryMilliseconds: true)
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: channel, expected: baseVersion, tokens: data,
                                                            loginRequired: "", writer: ownerID)
        let reply = try RedisOneShot.run(endpoint: endpoint, timeout: settings.commandTimeoutSeconds * 2, arguments)
        switch RedisScripts.compareAndSetOutcome(reply) {
        case .written: return
        case .conflict: throw RedisStoreError(description: "Redis key \(settings.key) holds a newer version; ours was not written")
        case .failed(let reason): throw RedisStoreError(description: reason)
        }
    }

    /// Failures answered without asking Redis still arrive from the loop, like replies do, never inside
    /// the call that asked.
    private func deferred(_ work: @escaping () -> Void) {
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
