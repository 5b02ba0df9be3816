import HTTPWire

/// The server's limits and timeouts, and the events of its connection limit: plain values the owner fills
/// in and reads, apart from `HTTPServer.swift` so that the listener's code is not between them.
extension HTTPServer {
    /// Limits and timeouts. Changing `HTTPServer.settings` (a configuration reload) applies the limits at
    /// once and the rest to connections accepted afterwards.
    public struct Settings: Sendable {
        public var limits: HTTPWireLimits
        /// Open client connections within the limit; 0: no limit.
        public var maxConnections: Int
        /// Connections that may wait over the limit; nil: an eighth of the limit, at least 16.
        public var overLimitAllowance: Int?
        /// How long a connection must have been quiet before it may be closed to make room.
        public var idleGrace: Double
        /// Seconds a request head may take from its first byte to its last (0: unbounded).
        public var headTimeout: Double
        /// Seconds a keep-alive connection may wait for its next request (from accept, or from the end of
        /// the last response) before it is closed without an answer (0: unbounded).
        public var idleTimeout: Double
        /// Seconds a request body may pause between two reads (0: unbounded). A stalled body is answered
        /// 408 (if no response has started) and the connection closes. Time while the handler has paused
        /// reading does not count.
        public var bodyTimeout: Double
        /// Seconds a response may wait with the client taking none of it (a client that stopped reading)
        /// before the connection is closed (0: unbounded). Any byte taken restarts it.
        public var sendTimeout: Double
        /// A hard cap on request bodies (0: none). A larger `Content-Length` is answered 413 before any
        /// body byte is read; a chunked body that grows past it is answered 413 (or closed, if a response
        /// has started) when it does. The product streams large bodies, so it leaves this at 0.
        public var maxBodyBytes: Int
        /// What an over-limit connection's request gets (`Connection: close` is added).
        public var overLimitResponse: HTTPResponseHead
        public var overLimitBody: [UInt8]
        /// Read buffer per connection (at least the head limit).
        public var inputCapacity: Int
        /// A newcomer never waits behind a connection that says nothing: at the limit the connection quiet
        /// the longest (idle, or trickling a head) is closed for it at once, with no grace, and at the
        /// limit plus the allowance one is closed instead of accepting pausing. For a port whose clients
        /// send their request the moment they connect (the admin port's probes): there, a flood of silent
        /// or slow connections that keeps reconnecting would otherwise fill the listen backlog ahead of
        /// the probe, and the probe would time out before it is even accepted. Only connections accepted
        /// before the current accept batch are closed on arrival, so each has had a loop turn to send.
        public var evictsQuietAtOnce = false

        public init(limits: HTTPWireLimits = HTTPWireLimits(), maxConnections: Int = 0, overLimitAllowance: Int? = nil,
                    idleGrace: Double = 1, headTimeout: Double = 10, idleTimeout: Double = 60, bodyTimeout: Double = 60,
                    sendTimeout: Double = 60, maxBodyBytes: Int = 0,
                    overLimitResponse: HTTPResponseHead = HTTPResponseHead(status: 503, reason: "Service Unavailable",
                                                                           fields: [("Content-Type", "text/plain"), ("Retry-After", "1")]),
                    overLimitBody: [UInt8] = Array("too many client connections\n".utf8),
                    inputCapacity: Int = 64 * 1024) {
            self.limits = limits
            self.maxConnections = maxConnections
            self.overLimitAllowance = overLimitAllowance
            self.idleGrace = idleGrace
            self.headTimeout = headTimeout
            self.idleTimeout = idleTimeout
            self.bodyTimeout = bodyTimeout
            self.sendTimeout = sendTimeout
            self.maxBodyBytes = maxBodyBytes
            self.overLimitResponse = overLimitResponse
            self.overLimitBody = overLimitBody
            self.inputCapacity = inputCapacity
        }

        /// The allowance in effect.
        public var effectiveOverLimitAllowance: Int { max(0, overLimitAllowance ?? max(16, maxConnections / 8)) }
    }

    /// What the connection limit made the server do (for a metric and a rate-limited warning).
    public enum LimitEvent: Sendable, Equatable {
        /// A connection was accepted over the limit; it waits for a slot.
        case acceptedOverLimit
        /// An over-limit connection's request was answered with `overLimitResponse` and closed.
        case refused
        /// An idle connection was closed to make room.
        case closedIdle
        /// A connection whose request head had been trickling in for longer than the grace was answered
        /// 408 and closed to make room (no connection was idle).
        case closedStalledHead
        /// At the limit plus the allowance: new connections wait in the listen backlog.
        case pausedAccepting
    }
}
