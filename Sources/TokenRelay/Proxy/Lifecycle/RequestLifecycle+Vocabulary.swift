/// The words `RequestLifecycle` speaks: what its driver tells it, and what it asks the driver to do.
/// Nothing here names a transport: the machine's tests run it without one.
extension RequestLifecycle {
    /// Fixed for the life of one request (taken at arrival: a reload does not change a request in flight).
    struct Settings {
        /// GET, HEAD, OPTIONS, PUT, DELETE (RFC 9110 §9.2.2): may be sent again after a connection died
        /// under it, because processing it twice is harmless by definition.
        var idempotent: Bool
        /// `timeouts.hold_seconds`, counted from the first hold (a second hold does not restart it).
        var holdSeconds: Double
        var poolWaitSeconds: Double
        /// From sending until the whole response head is in.
        var upstreamSeconds: Double
        var connectSeconds: Double
        /// `timeouts.stream_idle_seconds`: silence allowed once a response has started; here, while a gRPC
        /// answer's head is withheld until its first message (`responseHeadWithheld`).
        var streamIdleSeconds: Double = 300
    }

    /// Deadlines the machine sets; the driver arms one timer per kind and reports it with `timerFired`.
    enum Timer: Hashable, CaseIterable {
        /// Waiting in the pool's queue for a free upstream connection.
        case poolWait
        /// Waiting for a TCP (and TLS) connection to a new upstream connection.
        case connect
        /// Waiting for the complete response head (a head dripped a byte at a time must not last for ever).
        case responseHead
        /// Waiting for a refresh.
        case hold
    }

    /// How the upstream let a request down before or while answering it.
    struct UpstreamFailure: Equatable, CustomStringConvertible {
        enum Kind: String {
            case connect, connectTimeout = "connect_timeout", timeout, connectionLost = "connection_lost"
            case invalidResponse = "invalid_response", tooLarge = "too_large", tls
        }
        var kind: Kind
        /// Whether any byte of a response had arrived.
        var responseStarted: Bool
        /// For the 502 body and the log (never carries a secret: built from errno and OpenSSL reasons).
        var description: String

        var isTimeout: Bool { kind == .timeout || kind == .connectTimeout }
    }

    /// Which token, if any, a send carries. The token itself is not in the action: the driver sends the
    /// authorization of the admission it reported with `connectionAcquired`, whose generation this names.
    enum Credential: Equatable {
        /// A passthrough request: the client's own headers, nothing injected.
        case none
        case token(generation: UInt64)
    }

    enum ReplayReason: Equatable {
        /// The 401 came back for a token that had already been replaced: sent again without a refresh.
        case staleGeneration
        /// Sent again after the refresh it waited for.
        case afterRefresh
    }

    /// What the driver does, in the order given. Trivially copyable on purpose: no case carries a String,
    /// an array or a box, so that lists of actions are copied and dropped as plain bytes (every request
    /// runs a dozen of them through the driver; a payload on any one case, however rare, made each list a
    /// generic destroy and each action an outlined copy). What the rare actions need (the local answer,
    /// the upstream failure) travels beside them in their `ActionList` (`answer`, `failure`); what `finish`
    /// reports is the machine's `summary` (plain bytes, but the largest payload: in every action it would
    /// make each of them, and each list, twice as long).
    enum Action: Equatable {
        /// Ask the pool for a connection. `admittedEarlier`: a request released by a refresh queues in
        /// order and is never refused by the waiter bound meant for new arrivals.
        case acquireConnection(admittedEarlier: Bool)
        /// Give up a place in the pool's queue.
        case cancelConnectionWait
        /// The connection failed under a request that may be sent again: send it once more on a new
        /// connection (never on another idle one, which may be just as stale).
        case acquireFreshConnection
        /// Send the request on the connection just acquired, with this credential.
        case send(Credential)
        /// Stop the upstream request in flight; its connection is closed, never reused.
        case cancelUpstream
        /// Give the connection back to the pool (it decides whether it can be reused).
        case releaseConnection
        case schedule(Timer, after: Double)
        case cancel(Timer)
        /// Put the request on the list of held requests; the driver answers `holdRefused` when full.
        case hold
        /// Take it off that list (no-op if the proxy released it already).
        case unhold
        /// Ask the refresh rules about a refresh-triggering answer to a token of `sentGeneration`; the
        /// driver answers `refreshRulesDecided`.
        case consultRefreshRules(sentGeneration: UInt64)
        /// Tell the refresh rules of a refresh-triggering answer that goes to the client as it is (the
        /// request's streamed body cannot be sent again): the token is as dead as for any other, so it
        /// counts (coalesced as always); nothing is held and no decision comes back.
        case reportUnreplayableRefreshTrigger(sentGeneration: UInt64)
        /// Keep the response (head and body) instead of relaying it: it may be replaced by a replay's.
        case captureResponse
        /// Relay the upstream's response head and then its body to the client as it arrives.
        case relayResponse
        /// The relayed response is complete: end it to the client.
        case endRelayedResponse
        /// Answer the client with the response captured earlier.
        case respondCaptured
        /// Answer the client with tokenrelay's own response: the list's `answer`.
        case respond
        /// The response to the client cannot be completed: close its connection so it sees a truncated
        /// response, never a clean end. `flushFirst`: write what is queued first.
        case abortClient(flushFirst: Bool)
        case countReplay(ReplayReason)
        /// A DPoP nonce challenge was answered: count it and ask the pool for a connection (in the admitted
        /// lane) to send the request again; its send carries a fresh proof with the upstream's new nonce.
        case resendWithFreshProof
        /// Count and log the list's `failure`.
        case upstreamFailed
        /// Log that the request goes out again on a fresh connection, after the list's `failure`.
        case retrying
        /// The request is over: the driver frees what it still holds (timers, queue place, connection,
        /// hold registration) and reports the machine's `summary`. Always the last action, exactly once.
        case finish
    }

    /// What the access log and the metrics need to know about a request that ended.
    struct Summary: Equatable {
        /// 0: nobody was answered (the client went away).
        var status: Int
        var attempts: Int
        var generation: UInt64
        /// Set when the request was held: how long (first hold to the end) and how it ended.
        var hold: (seconds: Double, outcome: HoldOutcome)?

        static func == (lhs: Summary, rhs: Summary) -> Bool {
            lhs.status == rhs.status && lhs.attempts == rhs.attempts && lhs.generation == rhs.generation
                && lhs.hold?.seconds == rhs.hold?.seconds && lhs.hold?.outcome == rhs.hold?.outcome
        }
    }

    enum HoldOutcome: String, Equatable {
        case replayed, unavailable, unauthorized, clientGone = "client_gone", other
    }
}

extension LocalResponse: Equatable {
    static func == (lhs: LocalResponse, rhs: LocalResponse) -> Bool {
        lhs.status == rhs.status && lhs.body == rhs.body && lhs.headers.map { "\($0.name): \($0.value)" } == rhs.headers.map { "\($0.name): \($0.value)" }
    }
}
