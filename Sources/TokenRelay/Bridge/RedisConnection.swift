import CHiredis
import CLibevent
import FoundationEssentials
import Glibc

/// One reply from Redis, copied out of hiredis' reply objects.
enum RedisReply: Equatable {
    case status(String)
    case error(String)
    case integer(Int64)
    case string(Data)
    case null
    case array([RedisReply])

    var text: String? {
        switch self {
        case .string(let data): return String(decoding: data, as: UTF8.self)
        case .status(let text): return text
        case .integer(let value): return String(value)
        default: return nil
        }
    }

    var integer: Int64? {
        switch self {
        case .integer(let value): return value
        case .string, .status: return text.flatMap { Int64($0) }
        default: return nil
        }
    }
}

/// Where Redis is and how to log in (from `tokens.redis`).
struct RedisEndpoint: Equatable, Sendable {
    enum Address: Equatable, Sendable {
        case tcp(host: String, port: Int)
        case unix(path: String)
    }

    var address: Address
    var database = 0
    var username: String?
    var password: String?

    var description: String {
        switch address {
        case .tcp(let host, let port): return host.contains(":") ? "[\(host)]:\(port)/\(database)" : "\(host):\(port)/\(database)"
        case .unix(let path): return "unix://\(path)"
        }
    }
}

/// A connection to Redis on the event loop: commands are formatted by hiredis, written to a libevent
/// bufferevent, and replies parsed by hiredis' reader as bytes arrive, answered in order (Redis answers
/// a connection's commands in the order it received them).
///
/// Nothing blocks the loop: host names resolve through the loop's `evdns`, the connect is
/// non-blocking, and every command is bounded by `commandTimeout` (our own timer: a Redis that stopped
/// answering without closing the connection must not hold a refresh forever). Any failure closes the
/// connection and fails every command still waiting, once; the owner opens a new one.
///
/// Replies that no command waits for are pushes (pub/sub messages on a subscribed connection) and go to
/// `onPush`. Confined to the event loop thread.
final class RedisConnection {
    typealias Completion = (Result<RedisReply, RedisConnectionError>) -> Void

    let endpoint: RedisEndpoint
    private let loop: EventLoop
    private let commandTimeout: Double
    private var bufferEvent: OpaquePointer?
    private var reader: UnsafeMutablePointer<redisReader>?
    private var waiting: [Completion] = []
    private var timeoutTimer: LoopEvent?
    private var deferred: LoopEvent?
    private var deferredFailures: [(Completion, RedisConnectionError)] = []
    private(set) var closedReason: String?

    /// Called once when the connection closes for any reason but `close()`.
    var onClosed: ((String) -> Void)?
    var onPush: ((RedisReply) -> Void)?

    init(loop: EventLoop, endpoint: RedisEndpoint, commandTimeout: Double) {
        self.loop = loop
        self.endpoint = endpoint
        self.commandTimeout = commandTimeout
    }

    deinit { tearDown() }

    var isOpen: Bool { bufferEvent != nil && closedReason == nil }

    /// Starts connecting and queues the login (AUTH, SELECT) ahead of any command: the bufferevent keeps
    /// what is written before the connect completes. `ready` answers once the login has been accepted
    /// (a PING behind it came back).
    func open(ready: @escaping (String?) -> Void) {
        guard bufferEvent == nil, closedReason == nil else { return ready(closedReason ?? "already open") }
        reader = redisReaderCreate()
        let options = Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)
        guard let bev = bufferevent_socket_new(loop.base, -1, options) else { return fail("cannot create a socket buffer", notify: false, ready) }
        bufferEvent = bev
        bufferevent_setcb(bev, redisReadTrampoline, nil, redisEventTrampoline, unretainedContext(self))
        bufferevent_enable(bev, Int16(EV_READ | EV_WRITE))
        let started: Int32
        switch endpoint.address {
        case .tcp(let host, let port):
            started = bufferevent_socket_connect_hostname(bev, loop.dns, AF_UNSPEC, host, Int32(port))
        case .unix(let path):
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            let bytes = Array(path.utf8)
            guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
                return fail("unix socket path is too long", notify: false, ready)
            }
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (index, byte) in bytes.enumerated() { raw[index] = byte }
            }
            started = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bufferevent_socket_connect(bev, $0, Int32(MemoryLayout<sockaddr_un>.size))
                }
            }
        }
        guard started == 0 else { return fail("cannot connect to \(endpoint.description)", notify: false, ready) }
        if let password = endpoint.password {
            let login = endpoint.username.map { ["AUTH", $0, password] } ?? ["AUTH", password]
            send(login) { [weak self] result in
                // The reply names the cause (WRONGPASS, NOAUTH); it never echoes the password.
                if case .success(.error(let message)) = result { self?.close(because: "authentication failed: \(message)") }
            }
        }
        if endpoint.database != 0 {
            send(["SELECT", String(endpoint.database)]) { [weak self] result in
                if case .success(.error(let message)) = result { self?.close(because: "SELECT failed: \(message)") }
            }
        }
        send(["PING"]) { result in
            switch result {
            case .success(.error(let message)): ready(message)
            case .success: ready(nil)
            case .failure(let error): ready(error.description)
            }
        }
    }

    /// Sends one command; `completion` runs on the loop with its reply (a Redis error reply is a
    /// success here: `.error`), or with the reason the connection failed. Never called synchronously.
    func send(_ arguments: [String], completion: @escaping Completion) {
        send(arguments.map { Data($0.utf8) }, completion: completion)
    }

    func send(_ arguments: [Data], completion: @escaping Completion) {
        guard let bev = bufferEvent, closedReason == nil else {
            return deferFailure(completion, RedisConnectionError(description: closedReason ?? "not connected"))
        }
        guard let command = Self.format(arguments) else {
            return deferFailure(completion, RedisConnectionError(description: "cannot format the command"))
        }
        command.withUnsafeBytes { raw in _ = bufferevent_write(bev, raw.baseAddress, raw.count) }
        waiting.append(completion)
        if waiting.count == 1 { armTimeout() }
    }

    /// Closes without calling `onClosed`; commands still waiting fail with "closed".
    func close() {
        onClosed = nil
        close(because: "closed")
    }

    // MARK: - Bytes in

    func readable() {
        guard let bev = bufferEvent, let reader else { return }
        let input = bufferevent_get_input(bev)
        var chunk = [CChar](repeating: 0, count: 16 * 1024)
        while true {
            let count = evbuffer_remove(input, &chunk, chunk.count)
            guard count > 0 else { break }
            if redisReaderFeed(reader, chunk, Int(count)) != REDIS_OK { return close(because: "malformed reply from Redis") }
        }
        while closedReason == nil {
            var raw: UnsafeMutableRawPointer?
            guard redisReaderGetReply(reader, &raw) == REDIS_OK else { return close(because: "malformed reply from Redis") }
            guard let raw else { break }
            let reply = Self.copy(raw.assumingMemoryBound(to: redisReply.self))
            freeReplyObject(raw)
            deliver(reply)
        }
    }

    private func deliver(_ reply: RedisReply) {
        guard !waiting.isEmpty else {
            onPush?(reply)
            return
        }
        let completion = waiting.removeFirst()
        if waiting.isEmpty { timeoutTimer = nil } else { armTimeout() }
        completion(.success(reply))
    }

    func event(_ what: Int16) {
        if Int32(what) & BEV_EVENT_CONNECTED != 0 { return }
        if Int32(what) & BEV_EVENT_EOF != 0 { return close(because: "Redis closed the connection") }
        if let bev = bufferEvent, Int32(what) & BEV_EVENT_ERROR != 0 {
            let dnsError = bufferevent_socket_get_dns_error(bev)
            if dnsError != 0 { return close(because: "cannot resolve \(endpoint.description): \(String(cString: evutil_gai_strerror(dnsError)))") }
            let code = errno
            return close(because: "connection to \(endpoint.description) failed: \(String(cString: strerror(code)))")
        }
    }

    // MARK: - Failure

    /// Progress bound: each reply rearms it, so the oldest waiting command never waits longer than
    /// `commandTimeout` without any answer.
    private func armTimeout() {
        let timer = LoopEvent(loop: loop) { [weak self] _ in
            guard let self else { return }
            self.close(because: "Redis did not answer within \(Self.seconds(self.commandTimeout))")
        }
        timer.schedule(after: commandTimeout)
        timeoutTimer = timer
    }

    private func close(because reason: String) {
        guard closedReason == nil else { return }
        closedReason = reason
        tearDown()
        let failed = waiting
        waiting = []
        let error = RedisConnectionError(description: reason)
        let notify = onClosed
        onClosed = nil
        for completion in failed { completion(.failure(error)) }
        notify?(reason)
    }

    private func fail(_ reason: String, notify: Bool, _ ready: (String?) -> Void) {
        closedReason = reason
        tearDown()
        ready(reason)
    }

    /// Frees the bufferevent (callbacks cleared first: libevent may still deliver queued ones) and the
    /// reader. Safe from inside a bufferevent callback: libevent defers the free until it returns.
    private func tearDown() {
        timeoutTimer = nil
        if let bev = bufferEvent {
            bufferevent_setcb(bev, nil, nil, nil, nil)
            bufferevent_disable(bev, Int16(EV_READ | EV_WRITE))
            bufferevent_free(bev)
            bufferEvent = nil
        }
        if let reader {
            redisReaderFree(reader)
            self.reader = nil
        }
    }

    private func deferFailure(_ completion: @escaping Completion, _ error: RedisConnectionError) {
        deferredFailures.append((completion, error))
        if deferred == nil {
            deferred = LoopEvent(loop: loop) { [weak self] _ in
                guard let self else { return }
                let due = self.deferredFailures
                self.deferredFailures = []
                for (completion, error) in due { completion(.failure(error)) }
            }
        }
        deferred?.activate()
    }

    // MARK: - hiredis

    private static func format(_ arguments: [Data]) -> Data? {
        let lengths = arguments.map(\.count)
        // hiredis copies the argument bytes; the pointers only need to live through the call.
        let copies = arguments.map { data -> UnsafeMutablePointer<CChar> in
            let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(1, data.count))
            data.withUnsafeBytes { raw in
                if let base = raw.baseAddress { memcpy(buffer, base, data.count) }
            }
            return buffer
        }
        defer { copies.forEach { $0.deallocate() } }
        var target: UnsafeMutablePointer<CChar>?
        let length = copies.map { UnsafePointer<CChar>?($0) }.withUnsafeBufferPointer { argv in
            lengths.withUnsafeBufferPointer { argvlen in
                redisFormatCommandArgv(&target, Int32(arguments.count), UnsafeMutablePointer(mutating: argv.baseAddress), argvlen.baseAddress)
            }
        }
        guard length > 0, let target else { return nil }
        defer { redisFreeCommand(target) }
        return Data(bytes: target, count: Int(length))
    }

    private static func copy(_ reply: UnsafeMutablePointer<redisReply>) -> RedisReply {
        let value = reply.pointee
        switch value.type {
        case REDIS_REPLY_STRING: return .string(value.str.map { Data(bytes: $0, count: value.len) } ?? Data())
        case REDIS_REPLY_STATUS: return .status(value.str.map { String(decoding: Data(bytes: $0, count: value.len), as: UTF8.self) } ?? "")
        case REDIS_REPLY_ERROR: return .error(value.str.map { String(decoding: Data(bytes: $0, count: value.len), as: UTF8.self) } ?? "")
        case REDIS_REPLY_INTEGER: return .integer(value.integer)
        case REDIS_REPLY_ARRAY:
            guard let elements = value.element else { return .array([]) }
            return .array((0..<value.elements).map { index in elements[index].map(copy) ?? .null })
        default: return .null
        }
    }

    static func seconds(_ value: Double) -> String {
        value == value.rounded() ? "\(Int(value)) s" : cFormat("%.2f s", value)
    }
}

/// Why a command got no reply: the connection failed (the reason names the endpoint, never a secret).
struct RedisConnectionError: Error, CustomStringConvertible {
    let description: String
}
