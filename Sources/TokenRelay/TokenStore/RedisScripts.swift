import FoundationEssentials

/// The Lua scripts the Redis store runs. Each runs atomically in Redis: no other client's command
/// comes between its reads and its writes.
enum RedisScripts {
    /// KEYS[1] the token hash. ARGV: expected version, tokens JSON, login_required ("" clears it),
    /// writer id, channel. Writes only if the stored version is the expected one, bumps it by one, and
    /// publishes the new version in the same step, so no write goes unannounced. An absent key (a new
    /// store, or one that lost its data) takes any write, numbered past the writer's own version so the
    /// versions relays hold stay behind it. ARGV[6], given only by an operator's import, is the record's
    /// new `imported_at` (`RedisHeldSet`); a relay's write keeps the one there. ARGV[7], given only by a relay
    /// that keeps its DPoP key in the record (`DPoPFleetKey`), is that key's field value: stored with HSETNX,
    /// so a record that lost `dpop_key` (a flush, a recreated record) gets back the key the fleet's tokens are
    /// bound to at the next write, in the same step, and a key already there is never replaced. Returns
    /// {1, new version, 1 when the key field was stored again} or {0, stored version}.
    static let compareAndSet = """
        local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
        local expected = tonumber(ARGV[1])
        if current ~= 0 and current ~= expected then return {0, current} end
        local next = math.max(current, expected) + 1
        redis.call('HSET', KEYS[1], 'version', next, 'tokens', ARGV[2], 'writer', ARGV[4])
        if ARGV[3] == '' then redis.call('HDEL', KEYS[1], 'login_required') else redis.call('HSET', KEYS[1], 'login_required', ARGV[3]) end
        if ARGV[6] and ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'imported_at', ARGV[6]) end
        local keyStored = 0
        if ARGV[7] and ARGV[7] ~= '' then keyStored = redis.call('HSETNX', KEYS[1], 'dpop_key', ARGV[7]) end
        redis.call('PUBLISH', ARGV[5], next)
        return {1, next, keyStored}
        """

    /// KEYS[1] the lock. ARGV[1] our owner id. Deletes the lock only if it is still ours: a holder whose
    /// lock expired must not delete the next holder's.
    static let release = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """

    enum CompareAndSetOutcome: Equatable {
        case written(version: Int64)
        case conflict(stored: Int64)
        case failed(String)
    }

    static func compareAndSetArguments(key: String, channel: String, expected: Int64, tokens: Data, loginRequired: String,
                                       writer: String, importStamp: Int64? = nil, dpopKeyField: Data? = nil) -> [Data] {
        let stamp = importStamp.map { [String($0)] } ?? (dpopKeyField == nil ? [] : [""])
        return ["EVAL", compareAndSet, "1", key, String(expected)].map { Data($0.utf8) } + [tokens]
            + ([loginRequired, writer, channel] + stamp).map { Data($0.utf8) } + (dpopKeyField.map { [$0] } ?? [])
    }

    /// Whether a written compare-and-set stored the DPoP key field again (it was missing).
    static func storedDPoPKey(_ reply: RedisReply) -> Bool {
        guard case .array(let parts) = reply, parts.count == 3 else { return false }
        return parts[2].integer == 1
    }

    static func releaseArguments(lockKey: String, owner: String) -> [String] {
        ["EVAL", release, "1", lockKey, owner]
    }

    /// The same compare-and-delete for the in-flight record: deleted only if it still holds `value`.
    static func compareAndDeleteArguments(key: String, value: String) -> [String] {
        ["EVAL", release, "1", key, value]
    }

    static func compareAndSetOutcome(_ reply: RedisReply) -> CompareAndSetOutcome {
        switch reply {
        case .array(let parts) where parts.count == 2 || parts.count == 3:
            guard let flag = parts[0].integer, let version = parts[1].integer else { return .failed("unexpected reply from Redis") }
            return flag == 1 ? .written(version: version) : .conflict(stored: version)
        case .error(let message): return .failed("Redis: \(message)")
        default: return .failed("unexpected reply from Redis")
        }
    }
}

/// One command on a loop of its own, for the command line (`token import`, `token show`, `login`) and
/// the last write at exit: blocking is fine there, as no event loop is serving.
enum RedisOneShot {
    static func run(endpoint: RedisEndpoint, timeout: Double, _ commands: [Data]...) throws -> RedisReply {
        try runAll(endpoint: endpoint, timeout: timeout, commands).last ?? .null
    }

    static func run(endpoint: RedisEndpoint, timeout: Double, _ command: [String]) throws -> RedisReply {
        try runAll(endpoint: endpoint, timeout: timeout, [command.map { Data($0.utf8) }]).last ?? .null
    }

    /// Sends the commands in order on one connection and returns their replies.
    static func runAll(endpoint: RedisEndpoint, timeout: Double, _ commands: [[Data]]) throws -> [RedisReply] {
        let loop = try EventLoop()
        let connection = RedisConnection(loop: loop, endpoint: endpoint, commandTimeout: timeout)
        var replies: [RedisReply] = []
        var failure: String?
        connection.open { error in
            if let error {
                failure = error
                loop.stop()
            }
        }
        for (index, command) in commands.enumerated() {
            connection.send(command) { result in
                switch result {
                case .success(let reply): replies.append(reply)
                case .failure(let error): failure = failure ?? error.description
                }
                if index == commands.count - 1 || failure != nil { loop.stop() }
            }
        }
        let deadline = LoopEvent(loop: loop) { _ in
            failure = failure ?? "Redis \(endpoint.description) did not answer within \(RedisConnection.seconds(timeout))"
            loop.stop()
        }
        deadline.schedule(after: timeout + 1)
        loop.run()
        connection.close()
        if let failure { throw RedisStoreError(description: failure) }
        return replies
    }
}
