import FoundationEssentials

/// What a node says about its place in a replicated Redis (docs/redis.md): `ROLE` names it, and a write
/// sent to a replica comes back as a `READONLY` error. Both mean the same to the store: writes cannot land
/// on this node, so it is unavailable (never "healthy" while a rotation could not be saved).
enum RedisRole: Equatable {
    case master
    /// A replica (or a sentinel): names what it said, for /status and /readyz.
    case notMaster(String)
    /// `ROLE` refused (an ACL that does not allow it) or an unexpected shape: nothing learnt; a write
    /// answered `READONLY` still shows a replica.
    case unknown

    static func parse(_ reply: RedisReply) -> RedisRole {
        guard case .array(let fields) = reply, let role = fields.first?.text else { return .unknown }
        if role == "master" { return .master }
        return .notMaster(role == "slave" ? "replica" : role)
    }

    /// A `READONLY` error reply: a plain command's, or a script's (whose error carries the script's words
    /// after the code).
    static func isReadOnlyError(_ reply: RedisReply) -> Bool {
        guard case .error(let message) = reply else { return false }
        return message.hasPrefix("READONLY") || message.contains("-READONLY") || message.contains(" READONLY ")
    }
}
