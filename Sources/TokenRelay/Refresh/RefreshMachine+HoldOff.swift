import FoundationEssentials
import Glibc

/// The refresh hold-off after an unknown outcome, and the in-flight record it is read from.
/// Part of `RefreshMachine` (RefreshMachine.swift holds its state and reads in cycle order).
extension RefreshMachine {
    // MARK: - 8. The refresh hold-off after an unknown outcome

    /// Rule (the race it prevents: a refresh token presented a second time while the server is still
    /// working on its first presentation; a rotation server then sees a burnt token and revokes the whole
    /// session): after an unknown outcome no refresh token leaves again until that exchange cannot still
    /// be in progress at the server. Our side of its connection is closed already (the token endpoint
    /// client's connection is reset when a request fails), and the hold-off lasts
    /// until `refreshTimeout` plus a backoff have passed since the request was sent; the backoff doubles
    /// with each unknown outcome in a row. Meanwhile requests that need a new token get 503 with
    /// `Retry-After`, and a forced refresh cannot lift it.
    mutating func startHoldOff(sentAt: Double, reason: String, _ now: Instant) {
        let until = sentAt + nextHoldOffLength()
        let readable = Timestamp.format(now.wall.addingTimeInterval(until - now.monotonic))
        holdOff(until: until, reason: "refresh outcome unknown (\(reason)); the refresh token is not presented again before \(readable)")
    }

    /// The cycle's attempt wrote (or is writing) an in-flight record.
    var cycleHasRecordOut: Bool {
        guard case .refreshing(let cycle) = phase else { return false }
        switch cycle.step {
        case .recordingInFlight, .persisting: return true
        case .exchanging(_, let record): return record != nil
        case .waiting, .acquiringLock: return false
        }
    }

    /// `refreshTimeout` plus the backoff for one more unknown outcome in a row.
    mutating func nextHoldOffLength() -> Double {
        unknownOutcomes += 1
        let exponent = Double(min(unknownOutcomes - 1, 20))
        return settings.refreshTimeout + min(settings.backoffSeconds * pow(2, exponent), Self.maximumHoldOffBackoff)
    }

    mutating func holdOff(until: Double, reason: String) {
        holdOff = HoldOff(until: until, reason: reason)
        emit(.schedule(.holdOff, at: until))
        emit(.publish)
    }

    /// The same rule across restarts and processes, from the in-flight record (`inFlightRecorded`): a
    /// record for the refresh token in service whose exchange may still be in progress at the server
    /// (sent less than `refreshTimeout` plus the backoff ago) starts the hold-off; one whose time has
    /// passed leaves the refresh token in doubt (presented again only when needed, which replaces the
    /// record). The wall clock may have jumped: the hold-off never lasts longer than it would from now.
    /// A record for another refresh token is stale: removed, but only under the lock (`lockHeld`), or
    /// it could be the record of a process that rotated and presented again meanwhile; elsewhere it is
    /// ignored. An unreadable record (ours are written atomically, so not ours) counts as one for the
    /// refresh token in service, sent when the file was last written.
    mutating func consider(_ read: RefreshInFlightRead, lockHeld: Bool, _ now: Instant) {
        let inService = settings.needsRefreshToken ? tokens.refreshToken.map(TokenFingerprint.of) : nil
        let record: RefreshInFlightRecord
        switch read {
        case .none:
            recordOnDisk = nil
            return
        case .unreadable(let error, let writtenAt):
            guard inService != nil else { return }
            record = RefreshInFlightRecord(fingerprint: "unreadable", sentAt: writtenAt)
            if record != recordOnDisk { log(.error, "in-flight refresh marker unreadable; treating it as a refresh of the refresh token in service", ["error": error]) }
        case .record(let found):
            guard let inService, found.fingerprint == inService else {
                recordOnDisk = nil
                if lockHeld {
                    log(.info, "removed a stale in-flight refresh marker (it names another refresh token)", ["refresh_token": found.fingerprint])
                    emit(.removeInFlightRecord)
                }
                return
            }
            record = found
        }
        // Ours, or one already taken into account: the hold-off it started covers it.
        guard record != recordOnDisk, holdOff == nil else { return }
        recordOnDisk = record
        refreshTokenInDoubt = true
        let length = nextHoldOffLength()
        let remaining = min(record.sentAt.addingTimeInterval(length).timeIntervalSince(now.wall), length)
        let metadata = ["refresh_token": record.fingerprint, "sent_at": Timestamp.format(record.sentAt)]
        guard remaining > 0 else {
            log(.warning, "a refresh sent by a previous run ended with an unknown outcome; the refresh token may have been rotated", metadata)
            if case .idle = phase { scheduleProactiveRefresh(now) }
            return
        }
        let readable = Timestamp.format(now.wall.addingTimeInterval(remaining))
        log(.warning, "a refresh sent by a previous run may still be in progress; holding the refresh token back",
            metadata.merging(["until": readable]) { kept, _ in kept })
        holdOff(until: now.monotonic + remaining,
                reason: "a refresh sent by a previous run may still be in progress (refresh token \(record.fingerprint), sent at "
                    + "\(Timestamp.format(record.sentAt))); the refresh token is not presented again before \(readable)")
    }

    /// Only while holding the lock: without it, the file may be another process's record by now.
    mutating func removeInFlightRecord() {
        guard cycleHasRecordOut else { return }
        recordOnDisk = nil
        emit(.removeInFlightRecord)
    }

    func holdOffRetryAfter(_ now: Instant) -> Int? {
        guard let holdOff else { return nil }
        let remaining = holdOff.until - now.monotonic
        guard remaining > 0 else { return nil }
        return Int(min(remaining, 3600).rounded(.up))
    }

    /// The hold-off is over: the store first (another process may hold the answer we missed), then the
    /// next need starts a cycle that presents the refresh token once more.
    mutating func holdOffEnded(_ now: Instant) {
        holdOff = nil
        log(.info, "refresh hold-off over", ["unknown_outcomes": "\(unknownOutcomes)"])
        readingStoreAfterHoldOff = true
        emit(.readStore)
        emit(.publish)
    }
}
