import FoundationEssentials

/// The in-flight refresh record `<key>:inflight` (a fingerprint and a time, never a token). Apart
/// because it is written off the loop on a connection of its own, unlike the rest of the store.
extension RedisTokenStore {
    /// `<key>:inflight`: the fingerprint of the refresh token being presented and when (never the token).
    /// Rule (the race it prevents: the refreshing relay got its answer but could not write it (Redis
    /// stalled), then died; its lock expires and the next relay, reading the old version, presents the
    /// refresh token that answer burnt): the record is written, and acknowledged, before the refresh token
    /// leaves, and removed only once the answer is stored. A relay that finds one naming the refresh token
    /// in service treats that refresh's outcome as unknown (the hold-off, then "in doubt"), as a token
    /// file's `.refreshing` marker does. Read with every read of the store (`read`), so it is current
    /// under the lock.
    var inFlightKey: String { settings.key + ":inflight" }

    func readInFlightRecord() -> RefreshInFlightRead { inFlightRead }

    // Internal (was private): `read` in RedisTokenStore+Read.swift sends it.
    func readInFlight(_ commands: RedisConnection) {
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

    /// Off the loop, on a connection of its own: the refresh token leaves only once Redis has the record,
    /// and, with `wait_replicas` ≥ 1, once that many replicas have it too. Rule (the race it prevents: the
    /// sentinels promote a replica before the lock and this record reached it; a relay following the
    /// failover finds neither on the new master and presents the same refresh token → reuse, the session
    /// revoked): `WAIT` on the connection that wrote the record covers everything the master had taken
    /// before it, so our lock (taken earlier on the same master) too (docs/redis.md). Too few replicas in
    /// time throws: the machine treats it as a record that could not be written (the token is not sent,
    /// the record is removed, the lock released, a transient failure).
    func inFlightRecordWriter(for record: RefreshInFlightRecord) throws -> @Sendable () throws -> Void {
        let endpoint = endpoint, timeout = settings.commandTimeoutSeconds * 2, key = inFlightKey
        let wanted = settings.waitReplicas, waitMilliseconds = max(1, Int(settings.commandTimeoutSeconds * 500))
        let value = Self.encodeInFlight(record)
        inFlightRead = .record(record)
        return {
            var commands = [["SET", key, value]]
            if wanted > 0 { commands.append(["WAIT", String(wanted), String(waitMilliseconds)]) }
            let replies = try RedisOneShot.runAll(endpoint: endpoint, timeout: timeout, commands.map { $0.map { Data($0.utf8) } })
            guard let stored = replies.first, case .status = stored else {
                throw RedisStoreError(description: "Redis did not store the in-flight record: \(replies.first?.text ?? "error reply")")
            }
            guard wanted > 0 else { return }
            let confirmed = replies.count > 1 ? replies[1].integer : nil
            guard let confirmed, confirmed >= Int64(wanted) else {
                let count = confirmed.map(String.init) ?? "no answer: \(replies.count > 1 ? replies[1].text ?? "error reply" : "none")"
                throw RedisStoreError(description: "wait_replicas is \(wanted) but \(count) Redis replicas confirmed the refresh lock and "
                                      + "in-flight record within \(waitMilliseconds) ms")
            }
        }
    }

    /// Under the lock, once the answer is stored (or the record names a refresh token no longer in service,
    /// or `WAIT` did not confirm it). Compare-and-delete: only the record we last read or wrote goes, never
    /// one another relay wrote since (our lock may have expired meanwhile).
    func removeInFlightRecord() throws {
        let known = inFlightRead
        inFlightRead = .none
        guard case .record(let record) = known else {
            commands?.send(["DEL", inFlightKey]) { _ in }
            return
        }
        commands?.send(RedisScripts.compareAndDeleteArguments(key: inFlightKey, value: Self.encodeInFlight(record))) { _ in }
    }
}
