import FoundationEssentials
import Glibc

/// Fleet mode with `tokens.encryption`: a Redis value found plain (stored before encryption was configured)
/// or sealed with a previous key is rewritten sealed with the current key when a relay starts, by the same
/// compare-and-set every write uses, from the version just read: if anyone stored a newer version
/// meanwhile the rewrite is simply not made (that writer sealed it, or the next write will). The
/// "login required" mark travels with the value unchanged (the race: a reseal that cleared it would make
/// the fleet present a refresh token the server already refused).
enum RedisTokenResealing {
    enum Outcome: Equatable {
        case alreadySealed
        case empty
        case resealed(from: StoredTokenForm, version: Int64)
        case newerVersionStored
    }

    static func reseal(endpoint: RedisEndpoint, settings: RedisSettings, codec: TokenStateCodec) throws -> Outcome {
        let timeout = settings.commandTimeoutSeconds * 2
        let reply = try RedisOneShot.run(endpoint: endpoint, timeout: timeout, ["HMGET", settings.key, "version", "tokens", "login_required"])
        guard case .array(let fields) = reply, fields.count == 3 else { throw RedisStoreError(description: "unexpected reply from Redis") }
        guard let version = fields[0].integer, case .string(let data) = fields[1] else { return .empty }
        let (tokens, form) = try codec.decodeWithForm(data, name: "redis:\(settings.key)")
        guard codec.needsResealing(form) else { return .alreadySealed }
        let arguments = RedisScripts.compareAndSetArguments(key: settings.key, channel: settings.key + ":updates", expected: version,
                                                            tokens: try codec.encode(tokens, expiryMilliseconds: true), loginRequired: fields[2].text ?? "",
                                                            writer: "tokenrelay-reseal/\(getpid())")
        switch RedisScripts.compareAndSetOutcome(try RedisOneShot.run(endpoint: endpoint, timeout: timeout, arguments)) {
        case .written(let written): return .resealed(from: form, version: written)
        case .conflict: return .newerVersionStored
        case .failed(let reason): throw RedisStoreError(description: reason)
        }
    }
}
