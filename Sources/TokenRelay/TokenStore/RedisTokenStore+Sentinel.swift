import FoundationEssentials

/// Following the master through a failover (`tokens.redis.sentinel`). The store asks the sentinels before
/// every connect (`connect()`), so a dead master, a `READONLY` reply or a `ROLE` that says replica all end
/// in a fresh lookup; this part adds the announcement (`+switch-master`) and the record for /status.
///
/// What stays the same during a failover: the store is unreachable (or not writable) until the new master
/// answers `ROLE` as master, so the refresh machine serves with a token not known dead, never refreshes
/// alone and answers 503 with `Retry-After` once the token is dead — as for any unreachable Redis. The
/// put-back of a lost write (`putBack`) runs against the new master with the first poll after connecting,
/// and every read answers unreadable until it has, so no refresh token older than one this relay has
/// seen is presented.
extension RedisTokenStore {
    /// How the master was found, for /status: `url`, or the sentinel that named it.
    var masterFoundBy: String {
        guard let sentinel else { return "url" }
        return "sentinel master \(sentinel.target.master)" + (sentinel.answeredBy.map { " (asked \($0))" } ?? "")
    }

    /// The node in the outage reason: the master's address, or the sentinel setting before any was named.
    var nodeDescription: String {
        if sentinel != nil, case .tcp(_, 0) = endpoint.address { return settings.url }
        return endpoint.description
    }

    /// A `+switch-master` for our master: drop a connection to any other node and look again at once
    /// (the sentinels now name the new one), with the reconnect backoff reset — the announcement is the
    /// news the backoff was waiting for.
    func sentinelsSwitched(from: String, to: RedisEndpoint) {
        if commands != nil {
            // Connected or connecting: only another node is news.
            guard endpoint.address != to.address else { return }
            reconnectDelay = 0
            lost("the sentinels name \(to.description) as the master now, not this node (was \(from))")
        } else if reconnectTimer != nil {
            connect()
        }
        reconnectDelay = 0.1
    }

    /// The master confirmed by `ROLE`: a different address than the last one confirmed is a failover
    /// followed.
    func noteMaster() {
        let address = endpoint.description
        if let previous = sentinelState.master, previous != address {
            sentinelState.failoversFollowed += 1
            sentinelState.lastFailover = (Date(), previous, address)
            onCount?(.failoverFollowed)
            onFailoverFollowed?("followed a Redis failover: master \(previous) -> \(address), named by \(masterFoundBy)")
        }
        sentinelState.master = address
    }

    /// For /status `token_store.master.last_failover`.
    var lastFailoverReport: Any {
        guard let last = sentinelState.lastFailover else { return JSONNull() }
        return ["at": Timestamp.format(last.at), "from": last.from, "to": last.to] as [String: Any]
    }
}

/// What the store has seen of the sentinels' masters (kept on the store; see `RedisTokenStore+Sentinel`).
struct RedisSentinelState {
    var master: String?
    var failoversFollowed = 0
    var lastFailover: (at: Date, from: String, to: String)?
}
