import FoundationEssentials

/// The newest token set a relay wrote to Redis or adopted from it, kept as stored (encoded), with the import
/// stamp of the record it came from: what the relay writes back when Redis turns out to hold less.
///
/// `imported_at` (milliseconds since the epoch) is written into the record by an operator's `tokenrelay token
/// import` or `login`, and kept by every relay's write after it: it names the import a lineage of rotations
/// descends from.
struct RedisHeldSet {
    var version: Int64
    var value: Data
    var loginRequired: String
    var importStamp: Int64?

    enum Verdict: Equatable {
        /// Redis holds this version or a later one.
        case current
        /// Redis holds an older version of this lineage: a write lost (a failover that promoted a replica
        /// the write had not reached, a Redis restarted from an older snapshot). The held set goes back.
        case putBack
        /// Redis holds a lower version from an import newer than this lineage's (an operator's `token
        /// import` after a flush): the operator's tokens are adopted, never overwritten.
        case newerImport
    }

    /// Rule (the races it tells apart): a version lower than ours is either our lineage's past (a lost
    /// write: putting ours back is the only way nobody presents the refresh token our rotation burnt) or an
    /// operator's new start (a flush, then an import: putting ours back would replace the operator's
    /// session with one that may be revoked). Only an import stamp newer than our lineage's says the
    /// latter; the same stamp, an older one or none says the former. A latched set ("login required")
    /// holds nothing worth putting back.
    func verdict(storedVersion: Int64, storedImportStamp: Int64?) -> Verdict {
        guard storedVersion < version else { return .current }
        if let stamp = storedImportStamp, stamp > (importStamp ?? Int64.min) { return .newerImport }
        return loginRequired.isEmpty ? .putBack : .current
    }

    /// The stamp an import writes: now, and past the one Redis holds (an operator's clock behind the last
    /// importer's must not make a new import look older than the lineage it replaces).
    static func importStamp(now: Date, stored: Int64?) -> Int64 {
        let milliseconds = Int64(max(0, min(now.timeIntervalSince1970 * 1000, 9e15)).rounded(.down))
        // Clamped: the stored stamp is Redis's, and its largest value must not trap.
        return max(milliseconds, min(stored ?? 0, Int64.max - 1) + 1)
    }
}
