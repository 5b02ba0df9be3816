import FoundationEssentials
import Glibc
import HTTPTransport

/// The sentinels of `tokens.redis.sentinel` with their login resolved (password read from its
/// environment variable, TLS context loaded), and the data nodes' login (`tokens.redis`) that the
/// master's address is joined with. What we rely on about Sentinel: docs/redis.md, "Sentinel".
struct RedisSentinelTarget {
    let master: String
    let sentinels: [RedisEndpoint]
    /// Database, username, password and TLS of the data nodes; the address comes from the sentinels.
    let dataNode: RedisEndpoint

    /// nil without `tokens.redis.sentinel`. Throws one line naming the field (a missing password
    /// variable, a TLS file that does not load).
    static func build(settings: RedisSettings, dataNode: RedisEndpoint) throws -> RedisSentinelTarget? {
        guard let sentinel = settings.sentinel else { return nil }
        var password: String?
        if let name = sentinel.passwordEnv {
            guard let value = getenv(name).map({ String(cString: $0) }), !value.isEmpty else {
                throw ConfigError("tokens.redis.sentinel.password_env", "environment variable \(name) is not set or empty")
            }
            password = value
        }
        var tls: RedisTLS?
        if let settings = sentinel.tls {
            let field = "tokens.redis.sentinel.tls"
            do {
                let context = try TransportTLSClientContext(caFile: settings.caFile, clientCertificateFile: settings.clientCert,
                                                            clientKeyFile: settings.clientKey, verifyPeer: !settings.insecureSkipVerify,
                                                            serverName: settings.serverName)
                tls = RedisTLS(context: context, field: field)
            } catch {
                throw ConfigError(field, error.description)
            }
        }
        let sentinels = sentinel.addresses.map { address in
            RedisEndpoint(address: address, database: 0, username: sentinel.username, password: password, usesTLS: tls != nil, tls: tls)
        }
        return RedisSentinelTarget(master: sentinel.master, sentinels: sentinels, dataNode: dataNode)
    }

    func dataNode(host: String, port: Int) -> RedisEndpoint {
        var endpoint = dataNode
        endpoint.address = .tcp(host: host, port: port)
        return endpoint
    }

    var command: [String] { ["SENTINEL", "get-master-addr-by-name", master] }

    /// A sentinel's answer to `get-master-addr-by-name`: the address as two strings, or null when it does
    /// not monitor a master of that name (a wrong `master`, or a sentinel not yet configured).
    func masterEndpoint(from reply: RedisReply, sentinel: RedisEndpoint) -> Result<RedisEndpoint, RedisConnectionError> {
        switch reply {
        case .array(let parts) where parts.count == 2:
            guard let host = parts[0].text, !host.isEmpty, let port = parts[1].integer, (1...65535).contains(port) else { break }
            return .success(dataNode(host: host, port: Int(port)))
        case .null, .array([]):
            return .failure(RedisConnectionError(description: "sentinel \(Self.name(sentinel)) does not know a master named \(master)"))
        case .error(let message):
            return .failure(RedisConnectionError(description: "sentinel \(Self.name(sentinel)): \(message)"))
        default: break
        }
        return .failure(RedisConnectionError(description: "sentinel \(Self.name(sentinel)): unexpected reply to get-master-addr-by-name"))
    }

    static func name(_ endpoint: RedisEndpoint) -> String { RedisSentinelSettings.describe(endpoint.address) }

    /// For the command line and the start-up resealing (no event loop is serving; blocking is fine):
    /// the master's endpoint, asking each sentinel in turn. Without `sentinel`, `endpoint` unchanged.
    static func resolveBlocking(settings: RedisSettings, endpoint: RedisEndpoint) throws -> RedisEndpoint {
        guard let target = try build(settings: settings, dataNode: endpoint) else { return endpoint }
        var reasons: [String] = []
        for sentinel in target.sentinels {
            do {
                let reply = try RedisOneShot.run(endpoint: sentinel, timeout: settings.commandTimeoutSeconds, target.command)
                switch target.masterEndpoint(from: reply, sentinel: sentinel) {
                case .success(let master): return master
                case .failure(let error): reasons.append(error.description)
                }
            } catch {
                reasons.append("sentinel \(name(sentinel)): \(error)")
            }
        }
        throw RedisStoreError(description: "no sentinel named the master \(target.master): " + reasons.joined(separator: "; "))
    }
}

/// On the event loop: asks the sentinels in turn for the master's address (each on a short-lived
/// connection bounded by the command timeout, like every Redis command), and keeps one subscription to
/// a sentinel's `+switch-master` channel so that a failover is followed when it is announced, not at the
/// next reconnect. The store re-asks too whenever its connection fails or the node turns out no master,
/// so a lost subscription only delays noticing a failover; it is tried again on the next sentinel.
final class RedisSentinelLocator {
    let target: RedisSentinelTarget
    private let loop: EventLoop
    private let commandTimeout: Double
    /// The sentinel asked first: the last one that answered.
    private var preferred = 0
    private var query: RedisConnection?
    private var watch: RedisConnection?
    private var watchIndex = 0
    private var watchRetry: LoopEvent?
    /// PINGs the subscription (`keepWatchAlive`).
    private var watchKeepAlive: LoopEvent?
    private var stopped = false
    /// The sentinel that named the master in service, for /status.
    private(set) var answeredBy: String?
    private(set) var isWatching = false

    /// A `+switch-master` for our master: the new master's endpoint and the old address (text).
    var onSwitch: ((_ from: String, _ to: RedisEndpoint) -> Void)?
    /// The subscription was lost (the reason); the next sentinel is tried. For the log.
    var onWatchLost: ((_ reason: String) -> Void)?

    init(loop: EventLoop, target: RedisSentinelTarget, commandTimeout: Double) {
        self.loop = loop
        self.target = target
        self.commandTimeout = commandTimeout
    }

    deinit {
        query?.close()
        watch?.close()
    }

    /// Asks the sentinels, starting with the last that answered, until one names the master; fails with
    /// every sentinel's reason when none does. One lookup at a time (a second call while one runs fails).
    func locate(completion: @escaping (Result<RedisEndpoint, RedisConnectionError>) -> Void) {
        guard query == nil else { return completion(.failure(RedisConnectionError(description: "a sentinel lookup is under way"))) }
        ask(attempt: 0, reasons: [], completion: completion)
    }

    private func ask(attempt: Int, reasons: [String], completion: @escaping (Result<RedisEndpoint, RedisConnectionError>) -> Void) {
        let count = target.sentinels.count
        guard attempt < count else {
            return completion(.failure(RedisConnectionError(description: "no sentinel named the master \(target.master): "
                + reasons.joined(separator: "; "))))
        }
        let index = (preferred + attempt) % count
        let sentinel = target.sentinels[index]
        let connection = RedisConnection(loop: loop, endpoint: sentinel, commandTimeout: commandTimeout)
        query = connection
        connection.open { _ in }
        connection.send(target.command) { [weak self, weak connection] result in
            guard let self, let connection, self.query === connection else { return }
            self.query = nil
            connection.close()
            let answer = result.flatMap { self.target.masterEndpoint(from: $0, sentinel: sentinel) }
            switch answer {
            case .success(let master):
                self.preferred = index
                self.answeredBy = RedisSentinelTarget.name(sentinel)
                completion(.success(master))
            case .failure(let error):
                let reason = error.description.hasPrefix("sentinel ") ? error.description : "sentinel \(RedisSentinelTarget.name(sentinel)): \(error)"
                self.ask(attempt: attempt + 1, reasons: reasons + [reason], completion: completion)
            }
        }
    }

    /// The node a sentinel named did not work out (unreachable, or no master): the next lookup starts with
    /// the next sentinel. Race it prevents: the sentinels learn a failover one after another (the leader
    /// first, the others from its announcements, seconds later); asking the same one again keeps getting
    /// the dead master's address while another already names the new one.
    func askAnotherFirst() {
        preferred = (preferred + 1) % target.sentinels.count
    }

    /// The reconnect backoff's cap with Sentinel (2 s with `url`): a failover is expected to end within a few
    /// seconds, and each attempt is one sentinel question and one connect.
    static let longestReconnectDelay = 0.5

    // MARK: - +switch-master

    func startWatching() {
        stopped = false
        guard watch == nil else { return }
        let sentinel = target.sentinels[watchIndex % target.sentinels.count]
        let connection = RedisConnection(loop: loop, endpoint: sentinel, commandTimeout: commandTimeout)
        watch = connection
        connection.onPush = { [weak self] message in self?.received(message) }
        connection.onClosed = { [weak self, weak connection] reason in
            guard let self, let connection, self.watch === connection else { return }
            self.watchDropped("sentinel \(RedisSentinelTarget.name(sentinel)): \(reason)")
        }
        connection.open { _ in }
        connection.send(["SUBSCRIBE", "+switch-master"]) { [weak self, weak connection] result in
            guard let self, let connection, self.watch === connection else { return }
            guard case .success(.array) = result else {
                return self.watchDropped("sentinel \(RedisSentinelTarget.name(sentinel)) refused the subscription")
            }
            self.isWatching = true
            self.keepWatchAlive(connection)
            // An announcement made while no subscription was up is lost: ask once what the sentinels say
            // now (a requested failover leaves the old master up, and a master until the sentinels
            // reconfigure it, seconds later; nothing else would move us off it meanwhile).
            self.locate { [weak self] result in
                if case .success(let master) = result { self?.onSwitch?("the master before", master) }
            }
        }
    }

    /// How often the subscription is PINGed. Race it prevents: a sentinel that stops answering without
    /// closing its connection (a stalled process, a host gone from the network with no reset) would leave
    /// the subscription silent for good, and a failover announced meanwhile by the other sentinels would
    /// reach this relay only when the old master is reconfigured, many seconds later. A PING unanswered
    /// within the command timeout closes the connection, and the next sentinel is subscribed to.
    static let keepAliveInterval = 2.0

    /// In subscribed mode a sentinel answers PING with a `pong` array, in order with the messages already
    /// queued: a `+switch-master` message read in place of the answer is still delivered, and the `pong`
    /// that follows it goes to `received`, which ignores it.
    private func keepWatchAlive(_ connection: RedisConnection) {
        let keepAlive = LoopEvent.repeating(loop: loop) { [weak self, weak connection] in
            guard let self, let connection, self.watch === connection else { return }
            connection.send(["PING"]) { [weak self] result in
                if case .success(let reply) = result { self?.received(reply) }
            }
        }
        keepAlive.schedule(after: Self.keepAliveInterval)
        watchKeepAlive = keepAlive
    }

    func stop() {
        stopped = true
        watchRetry = nil
        watchKeepAlive = nil
        watch?.close()
        watch = nil
        isWatching = false
        query?.close()
        query = nil
    }

    /// The subscription failed or its sentinel went away: the next sentinel, after a pause (the store's
    /// own re-asking carries a failover meanwhile).
    private func watchDropped(_ reason: String) {
        watch?.close()
        watch = nil
        watchKeepAlive = nil
        isWatching = false
        guard !stopped else { return }
        onWatchLost?(reason)
        watchIndex += 1
        let retry = LoopEvent(loop: loop) { [weak self] _ in self?.startWatching() }
        retry.schedule(after: 1)
        watchRetry = retry
    }

    /// `message`, `+switch-master`, "<master> <old ip> <old port> <new ip> <new port>".
    private func received(_ message: RedisReply) {
        guard case .array(let parts) = message, parts.count == 3, parts[0].text == "message", parts[1].text == "+switch-master",
              let payload = parts[2].text else { return }
        let fields = payload.split(separator: " ").map(String.init)
        guard fields.count == 5, fields[0] == target.master, let port = Int(fields[4]), (1...65535).contains(port) else { return }
        let from = fields[1].contains(":") ? "[\(fields[1])]:\(fields[2])" : "\(fields[1]):\(fields[2])"
        onSwitch?(from, target.dataNode(host: fields[3], port: port))
    }
}
