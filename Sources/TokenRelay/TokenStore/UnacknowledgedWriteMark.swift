import FoundationEssentials

/// Fleet mode's local cache (`tokens.file` beside `tokens.redis`) marks a token set that Redis has not
/// acknowledged: the field `redis_write_unacknowledged` holds the version the write was based on and the
/// import stamp of its lineage (`RedisHeldSet`). Never a token, and never written to Redis.
///
/// Rule (the race it prevents: a relay gets rotated tokens from the token server, Redis stalls so the write
/// is not acknowledged, and the relay dies; its lock expires and the rest of the fleet, reading the old
/// version, presents the refresh token that rotation burnt, and a rotation server revokes the session): a
/// cycle's tokens go to the cache, marked, as they go to Redis, and the mark stays until Redis's
/// acknowledgement is followed by an unmarked write. A relay that starts from a marked cache holds that set
/// as a version past the marked one, so once Redis answers with the version the write was based on (or a
/// lower one of the same lineage) it writes the set back with the compare-and-set (`RedisTokenStore`),
/// before it refreshes or adopts anything.
enum UnacknowledgedWriteMark {
    static let field = "redis_write_unacknowledged"

    struct Mark: Equatable {
        /// The version the unacknowledged write expected in Redis.
        var overVersion: Int64
        var importStamp: Int64?
    }

    static func marking(_ tokens: TokenSet, _ mark: Mark) -> TokenSet {
        var marked = tokens
        var value: [String: Any] = ["over_version": Int(clamping: mark.overVersion)]
        value["imported_at"] = mark.importStamp.map { Int(clamping: $0) }
        marked.otherFields[field] = value
        return marked
    }

    /// The mark (nil when absent or unusable) and the tokens without it.
    static func take(from tokens: TokenSet) -> (tokens: TokenSet, mark: Mark?) {
        var plain = tokens
        guard let value = plain.otherFields.removeValue(forKey: field) else { return (tokens, nil) }
        guard let object = value as? [String: Any], let over = object["over_version"] as? JSONNumber, over.doubleValue >= 0 else {
            return (plain, nil)
        }
        let stamp = (object["imported_at"] as? JSONNumber).map { Int64(clamping: $0.intValue) }
        return (plain, Mark(overVersion: Int64(clamping: over.intValue), importStamp: stamp))
    }
}
