import FoundationEssentials
import HTTPTransport
import RedisProtocol

/// Replies as the RESP target parses them; named here so the store and its tests need not import it.
typealias RedisReply = RedisProtocol.RedisReply

/// A connection to Redis on the event loop: commands are formatted by hiredis (`RESPCommand`), written
/// to the transport's byte stream (TCP, a unix socket, or TLS for `rediss://`), and replies parsed by
/// hiredis' reader (`RESPReader`) as bytes arrive, answered in order (Redis answers a connection's
/// commands in the order it received them).
///
/// Nothing blocks the loop: host names resolve through the loop's resolver, the connect is non-blocking
/// and bounded by `commandTimeout` (resolving, connecting and the TLS handshake together), and every
/// command is bounded by `commandTimeout` once connected (our own timer: a Redis that stopped answering
/// without closing the connection must not hold a refresh forever). Any failure closes the connection
/// and fails every command still waiting, once; the owner opens a new one.
///
/// Replies that no command waits for are pushes (pub/sub messages on a subscribed connection) and go to
/// `onPush`. Confined to the event loop thread.
final class RedisConnection {
    typealias Completion = (Result<RedisReply, RedisConnectionError>) -> Void

    let endpoint: RedisEndpoint
    private let loop: EventLoop
    private let commandTimeout: Double
    private var stream: ByteStreamConnection?
    private let reader = RESPReader()
    private var waiting: [Completion] = []
    private var timeoutTimer: TransportTimer?
    private var deferred: TransportTimer?
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

    deinit { stream?.close() }

    var isOpen: Bool { stream != nil && closedReason == nil }

    /// Starts connecting and queues the login (AUTH, SELECT) ahead of any command: the stream keeps what
    /// is written before the connect (and the handshake) completes. `ready` answers once the login has
    /// been accepted (a PING behind it came back).
    func open(ready: @escaping (String?) -> Void) {
        guard stream == nil, closedReason == nil else { return ready(closedReason ?? "already open") }
        let destination: ByteStreamConnection.Destination
        switch endpoint.address {
        case .tcp(let host, let port): destination = .tcp(host: host, port: UInt16(clamping: port))
        case .unix(let path): destination = .unix(path: path)
        }
        if endpoint.usesTLS && endpoint.tls == nil { return fail("rediss:// without a TLS context", ready) }
        let opened: ByteStreamConnection
        do {
            opened = try ByteStreamConnection(loop: loop.transport, to: destination, tls: endpoint.tls?.context,
                                              connectTimeout: commandTimeout)
        } catch {
            return fail(describe(error), ready)
        }
        stream = opened
        opened.onBytes = { [weak self] bytes in self?.received(bytes) }
        opened.onConnected = { [weak self] in
            guard let self, !self.waiting.isEmpty else { return }
            self.armTimeout()
        }
        opened.onClosed = { [weak self] failure in
            guard let self else { return }
            self.close(because: self.describe(failure))
        }
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
        guard let stream, closedReason == nil else {
            return deferFailure(completion, RedisConnectionError(description: closedReason ?? "not connected"))
        }
        guard let command = RESPCommand.format(arguments) else {
            return deferFailure(completion, RedisConnectionError(description: "cannot format the command"))
        }
        waiting.append(completion)
        // While connecting, the stream's connect timeout bounds the wait; the command bound starts once open.
        if waiting.count == 1 && stream.isOpen { armTimeout() }
        stream.write(command)
    }

    /// Closes without calling `onClosed`; commands still waiting fail with "closed".
    func close() {
        onClosed = nil
        close(because: "closed")
    }

    // MARK: - Bytes in

    private func received(_ bytes: UnsafeRawBufferPointer) {
        do {
            try reader.feed(bytes)
            while closedReason == nil, let reply = try reader.nextReply() {
                deliver(reply)
            }
        } catch {
            close(because: error.description)
        }
    }

    private func deliver(_ reply: RedisReply) {
        guard !waiting.isEmpty else {
            onPush?(reply)
            return
        }
        let completion = waiting.removeFirst()
        if waiting.isEmpty { timeoutTimer?.cancel() } else { armTimeout() }
        completion(.success(reply))
    }

    /// The stream's words, with the TLS setting to look at when the handshake failed (a wrong CA, a
    /// server name the certificate does not carry).
    private func describe(_ failure: ByteStreamConnection.Failure) -> String {
        guard failure.stage == .handshake, let tls = endpoint.tls else { return failure.description }
        return "\(tls.field): \(failure.description)"
    }

    // MARK: - Failure

    /// Progress bound: each reply rearms it, so the oldest waiting command never waits longer than
    /// `commandTimeout` without any answer.
    private func armTimeout() {
        if timeoutTimer == nil {
            timeoutTimer = TransportTimer(loop: loop.transport) { [weak self] in
                guard let self else { return }
                self.close(because: "Redis did not answer within \(Self.seconds(self.commandTimeout))")
            }
        }
        timeoutTimer?.schedule(after: commandTimeout)
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

    private func fail(_ reason: String, _ ready: (String?) -> Void) {
        closedReason = reason
        tearDown()
        ready(reason)
    }

    private func tearDown() {
        timeoutTimer?.cancel()
        timeoutTimer = nil
        stream?.close()
    }

    private func deferFailure(_ completion: @escaping Completion, _ error: RedisConnectionError) {
        deferredFailures.append((completion, error))
        if deferred == nil {
            deferred = TransportTimer(loop: loop.transport) { [weak self] in
                guard let self else { return }
                let due = self.deferredFailures
                self.deferredFailures = []
                for (completion, error) in due { completion(.failure(error)) }
            }
        }
        if deferred?.isScheduled == false { deferred?.schedule(after: 0) }
    }

    static func seconds(_ value: Double) -> String {
        value == value.rounded() ? "\(Int(value)) s" : cFormat("%.2f s", value)
    }
}

/// Why a command got no reply: the connection failed (the reason names the endpoint, never a secret).
struct RedisConnectionError: Error, CustomStringConvertible {
    let description: String
}
