/// Where the token set lives between processes and restarts: a file (one host) or Redis (a fleet). The
/// refresh machine's driver talks to it only through this interface. Every completion runs on the event
/// loop; nothing here may block it (a file's fsync goes to a helper thread, Redis is asynchronous).
/// `acquire`/`release` serialise refreshes among everyone sharing the store.
protocol TokenStore: AnyObject {
    /// A short name for logs and errors (the file's path, the Redis key).
    var name: String { get }
    /// `file` or `redis`, for /status.
    var kind: String { get }
    /// Shared by a fleet: it announces other writers' versions (`onChange`) and can be out of reach
    /// (`onReachability`); its lock wait can be given up (`release`) when news arrives meanwhile.
    var isShared: Bool { get }
    /// Someone else stored new tokens (a shared store's announcement).
    var onChange: (() -> Void)? { get set }
    /// nil: reachable; otherwise why not.
    var onReachability: ((String?) -> Void)? { get set }
    /// Connects (a shared store); a file has nothing to do.
    func start()
    /// Tokens someone else wrote since `changeSinceLastLook()` last said so: a cheap check, then a read.
    func changeSinceLastLook() -> Bool
    /// The stored tokens, checked (a file must be private and well-formed).
    func read(completion: @escaping (RefreshMachine.StoreRead) -> Void)
    /// Records that the tokens last read are the ones in service (a write is based on them).
    func noteAdopted()
    /// Replaces the stored tokens; answers once they are durable as far as the store can tell.
    func write(_ tokens: TokenSet, completion: @escaping (TokenStoreWrite) -> Void)
    /// Stores "login required" with the token set, for everyone sharing the store.
    func latchLoginRequired(_ tokens: TokenSet, reason: String)
    /// Takes the refresh lock, calling back on the event loop (`acquired`, `waited`), giving up after
    /// `timeout` seconds.
    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void)
    /// Monotonic time until which the lock just acquired is certainly ours; nil: held until released.
    var lockValidUntil: Double? { get }
    /// A reload: how long the next lock taken lives (a lock that expires by itself); a lock already held
    /// keeps the life it was taken with. A lock held until released ignores it.
    func useLockLifetime(_ seconds: Double)
    /// Releases the lock, or gives up a wait for it (whose completion is then never called).
    func release()
    /// At exit, after the event loop stopped: one last write, blocking.
    func writeAtExit(_ tokens: TokenSet) throws

    /// The in-flight refresh record (`RefreshInFlightMarker`): read, written (safe to run off the loop; it
    /// fsyncs) and removed by the refresh driver; the refresh machine decides when.
    func readInFlightRecord() -> RefreshInFlightRead
    func inFlightRecordWriter(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void
    func removeInFlightRecord() throws
}

enum TokenStoreWrite {
    case written
    case failed(String)
    /// A newer version was stored meanwhile; this is what the store holds now.
    case conflict(RefreshMachine.StoreRead)
}
