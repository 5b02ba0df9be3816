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
}
