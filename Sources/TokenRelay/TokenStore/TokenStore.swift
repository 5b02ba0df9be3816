/// Where the token set lives between processes and restarts. The refresh machine's driver talks to
/// it only through this interface, so another store (Redis, for a fleet) can take the file's place.
///
/// `read` and `write` may block (a file's fsync, a network round trip): the driver calls them off the
/// event loop where it matters. `acquire`/`release` serialise refreshes among everyone sharing the
/// store.
protocol TokenStore: AnyObject {
    /// A short name for logs and errors (the file's path, the key).
    var name: String { get }
    /// Tokens someone else wrote since `changeSinceLastLook()` last said so: a cheap check, then a read.
    func changeSinceLastLook() -> Bool
    /// The stored tokens, checked (a file must be private and well-formed).
    func read() throws -> TokenSet
    /// Replaces the stored tokens atomically. Safe to call from a helper thread.
    func writer(for tokens: TokenSet) throws -> @Sendable () throws -> Void
    /// Records that what is stored now is ours (after our own write), so it is not mistaken for news.
    func noteOwnWrite()
    /// Takes the refresh lock, calling back on the event loop (`acquired`, `waited`), giving up after
    /// `timeout` seconds.
    func acquire(timeout: Double, completion: @escaping (_ acquired: Bool, _ waited: Bool) -> Void)
    func release()

    /// The in-flight refresh record (`RefreshInFlightMarker`): read, written (safe to run off the loop; it
    /// fsyncs) and removed by the refresh driver; the refresh machine decides when.
    func readInFlightRecord() -> RefreshInFlightRead
    func inFlightRecordWriter(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void
    func removeInFlightRecord() throws
}
