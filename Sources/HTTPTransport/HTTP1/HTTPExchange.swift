import Glibc
import HTTPWire

/// One request and its whole, small response, on a connection of its own that is closed afterwards:
/// the token endpoint, the device-login endpoints, the demo's traffic. Outside any pool on purpose: such
/// a request must never queue behind proxied requests, and a fresh connection per exchange cannot meet
/// a keep-alive connection the server closed in the meantime (a request that failed that way could not
/// be told apart from one the server received).
///
/// Built on `HTTPClientConnection`, so resolving, connecting, TLS, the response parser and its
/// strictness are the proxied path's. The response body is collected up to a byte limit; the whole
/// exchange, connecting included, has one deadline.
///
/// The completion runs exactly once, on the loop's thread, from a loop callback (never inside `init`),
/// unless `cancel()` came first. Keep a reference while the exchange runs: releasing the last one
/// cancels it. Failures describe what happened without quoting the request, so the fields and body may
/// carry secrets.
public final class HTTPExchange {
    public struct Request: Sendable {
        /// A name (resolved on the loop's resolver) or an IP literal.
        public var host: String
        public var port: UInt16
        /// Talk TLS with this context (its `serverName`, else `host`, is sent and verified).
        public var tls: TransportTLSClientContext?
        public var method: String
        /// Sent byte for byte: path and query, already encoded.
        public var target: String
        /// Sent as given, `Host` included; framing fields (Content-Length, Transfer-Encoding, Connection)
        /// are the transport's and are dropped, and so is a field with a control character.
        public var fields: [(name: String, value: String)]
        public var body: [UInt8]

        public init(host: String, port: UInt16, tls: TransportTLSClientContext? = nil, method: String, target: String,
                    fields: [(name: String, value: String)] = [], body: [UInt8] = []) {
            self.host = host
            self.port = port
            self.tls = tls
            self.method = method
            self.target = target
            self.fields = fields
            self.body = body
        }
    }

    public struct Limits: Sendable {
        /// Longest the whole exchange may take, from `init` to the last byte of the response.
        public var timeoutSeconds: Double
        /// Longest resolving, connecting and the TLS handshake may take; nil: `timeoutSeconds`.
        public var connectTimeoutSeconds: Double?
        /// Largest response body collected; a larger one fails the exchange.
        public var maxBodyBytes: Int
        /// Largest response head (status line and fields).
        public var maxHeadBytes: Int

        public init(timeoutSeconds: Double, connectTimeoutSeconds: Double? = nil, maxBodyBytes: Int = 1 << 20,
                    maxHeadBytes: Int = 64 * 1024) {
            self.timeoutSeconds = timeoutSeconds
            self.connectTimeoutSeconds = connectTimeoutSeconds
            self.maxBodyBytes = maxBodyBytes
            self.maxHeadBytes = maxHeadBytes
        }
    }

    public struct Response: Sendable {
        public let status: Int
        /// In the order received, names as sent.
        public let fields: [(name: String, value: String)]
        public let body: [UInt8]

        /// The first field of that name (case-insensitive).
        public func field(_ name: String) -> String? {
            let wanted = name.lowercased()
            return fields.first { $0.name.lowercased() == wanted }?.value
        }
    }

    /// Why an exchange did not produce a response. The texts never quote the request.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// The host name did not resolve ("cannot resolve idp.example: name does not exist").
        case nameNotResolved(String)
        /// No address accepted the connection ("connect 127.0.0.1:9: Connection refused").
        case connectFailed(String)
        /// Resolving, connecting or the handshake did not finish in time.
        case connectTimedOut(String)
        /// The TLS handshake failed: `reason` names the cause ("certificate verification failed: hostname
        /// mismatch", "TLS alert from the peer: handshake failure"); `certificateRejected` when our
        /// verification refused the peer's certificate.
        case tlsHandshakeFailed(reason: String, certificateRejected: Bool)
        /// TLS failed on the established connection (an alert from the peer after the handshake).
        case tlsFailed(reason: String, responseStarted: Bool)
        /// The deadline passed once the connection was up.
        case timedOut(responseStarted: Bool)
        /// The peer closed or reset the connection before the response was complete.
        case connectionLost(responseStarted: Bool, cause: String?)
        /// The response head or body was larger than the limit.
        case responseTooLarge(limit: Int)
        /// The response broke HTTP/1.1 (the parser's reason, which never quotes the peer's bytes).
        case malformedResponse(String)

        /// Whether the request may have reached the peer (and been acted on): false only when the
        /// connection was never established, so that no byte of the request left.
        public var requestMayHaveReachedPeer: Bool {
            switch self {
            case .nameNotResolved, .connectFailed, .connectTimedOut, .tlsHandshakeFailed: return false
            case .tlsFailed, .timedOut, .connectionLost, .responseTooLarge, .malformedResponse: return true
            }
        }

        /// Whether any byte of a response had arrived.
        public var responseStarted: Bool {
            switch self {
            case .tlsFailed(_, let started), .timedOut(let started), .connectionLost(let started, _): return started
            case .responseTooLarge, .malformedResponse: return true
            case .nameNotResolved, .connectFailed, .connectTimedOut, .tlsHandshakeFailed: return false
            }
        }

        public var description: String {
            switch self {
            case .nameNotResolved(let detail), .connectFailed(let detail): return "could not connect: \(detail)"
            case .connectTimedOut(let detail): return "could not connect in time: \(detail)"
            case .tlsHandshakeFailed(let reason, _), .tlsFailed(let reason, _): return "TLS failure: \(reason)"
            case .timedOut: return "timed out"
            case .connectionLost(let started, let cause):
                return (started ? "connection lost mid-response" : "connection closed before a response") + (cause.map { " (\($0))" } ?? "")
            case .responseTooLarge(let limit): return "response too large (over \(limit) bytes)"
            case .malformedResponse(let reason): return "invalid HTTP response: \(reason)"
            }
        }
    }

    public typealias Completion = (Result<Response, Failure>) -> Void

    private let limits: Limits
    private var completion: Completion?
    private var connection: HTTPClientConnection?
    private var deadline: TransportTimer?
    private var status = 0
    private var fields: [(name: String, value: String)] = []
    private var body: [UInt8] = []
    private var headReceived = false

    /// Starts the exchange at once.
    public init(loop: TransportLoop, request: Request, limits: Limits, completion: @escaping Completion) {
        self.limits = limits
        self.completion = completion
        let overall = limits.timeoutSeconds
        deadline = TransportTimer(loop: loop) { [weak self] in self?.deadlinePassed() }
        deadline?.schedule(after: overall)
        let connection: HTTPClientConnection
        do {
            connection = try HTTPClientConnection(
                loop: loop, host: request.host, port: request.port,
                limits: HTTPWireLimits(maxHeadBytes: max(1024, limits.maxHeadBytes)), inputCapacity: 16 * 1024,
                tls: request.tls, connectTimeout: min(limits.connectTimeoutSeconds ?? overall, overall))
        } catch {
            // Failed on the spot (a malformed host, an address refused at once): reported from the loop,
            // never from inside init, where the caller does not hold the exchange yet.
            let failure = Self.connectFailure(error.cause, error.description)
            deadline?.cancel()
            deadline = TransportTimer(loop: loop) { [weak self] in self?.finish(.failure(failure)) }
            deadline?.schedule(after: 0)
            return
        }
        self.connection = connection
        connection.handler = ExchangeReports(self)
        let bodiless = request.body.isEmpty && (request.method == "GET" || request.method == "HEAD")
        connection.startRequest(method: request.method, target: Array(request.target.utf8), fields: request.fields,
                                body: bodiless ? .none : .known(request.body.count))
        if !request.body.isEmpty { connection.sendBody(request.body) }
        connection.finishRequest()
    }

    /// Stops the exchange and closes its connection; the completion will not run.
    public func cancel() {
        completion = nil
        closeConnection()
        deadline?.cancel()
    }

    deinit {
        connection?.handler = nil
        connection?.close()
    }

    private func closeConnection() {
        guard let connection else { return }
        self.connection = nil
        connection.handler = nil
        connection.close()
    }

    private func finish(_ result: Result<Response, Failure>) {
        deadline?.cancel()
        closeConnection()
        guard let completion else { return }
        self.completion = nil
        completion(result)
    }

    private func deadlinePassed() {
        guard connection != nil else { return }
        let limit = Self.seconds(limits.timeoutSeconds)
        if connection?.stream.isOpen == true || headReceived {
            finish(.failure(.timedOut(responseStarted: headReceived)))
        } else {
            finish(.failure(.connectTimedOut("no connection to \(connection?.host ?? "the host") within \(limit)")))
        }
    }

    private static func seconds(_ value: Double) -> String {
        value.rounded() == value && value < 1e9 ? "\(Int(value)) s" : "\(value) s"
    }

    private static func connectFailure(_ cause: HTTPClientConnection.ConnectFailureCause?, _ text: String) -> Failure {
        switch cause {
        case .nameResolution: return .nameNotResolved(text)
        case .timedOut: return .connectTimedOut(text)
        case .tlsHandshake(let reason, let rejected): return .tlsHandshakeFailed(reason: reason, certificateRejected: rejected)
        case .connect, nil: return .connectFailed(text)
        }
    }
}

extension HTTPExchange: HTTPClientConnectionHandler {
    public func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}

    public func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        headReceived = true
        status = head.status
        // A one-shot request never asks to switch protocols: after a 101 nothing is HTTP and no end would
        // ever come, so the exchange would only run into its deadline and be reported as a timeout.
        if head.status == 101 {
            return finish(.failure(.malformedResponse("101 Switching Protocols to a request that did not ask for an upgrade")))
        }
        // An announced length over the limit fails now, before any of it is read.
        if case .length(let announced) = head.framing, announced > limits.maxBodyBytes {
            return finish(.failure(.responseTooLarge(limit: limits.maxBodyBytes)))
        }
        var fields: [(name: String, value: String)] = []
        head.forEachField { name, value in
            fields.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
        }
        self.fields = fields
    }

    public func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        guard bytes.count <= limits.maxBodyBytes - body.count else {
            return finish(.failure(.responseTooLarge(limit: limits.maxBodyBytes)))
        }
        body.append(contentsOf: bytes)
    }

    public func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        finish(.success(Response(status: status, fields: fields, body: body)))
    }

    public func connectionCanSendMore(_ connection: HTTPClientConnection) {}

    public func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        let started = responseStarted || headReceived
        let failure: Failure
        switch ended {
        case .connectFailed(let text):
            failure = Self.connectFailure(connection.connectFailureCause, text)
        case .timedOut:
            failure = .timedOut(responseStarted: started)
        case .protocolError(.headTooLarge):
            failure = .responseTooLarge(limit: limits.maxHeadBytes)
        case .protocolError(let error):
            failure = .malformedResponse(error.reason)
        case .unsolicitedBytes:
            failure = .malformedResponse("bytes that belong to no response")
        case .failed(let errno):
            if let reason = connection.stream.failureReason {
                failure = .tlsFailed(reason: reason, responseStarted: started)
            } else {
                failure = .connectionLost(responseStarted: started, cause: String(cString: strerror(errno)))
            }
        case .peerClosed, .closedLocally, .headTimeout, .idleTimeout, .refusedOverLimit, .bodyTooLarge:
            failure = .connectionLost(responseStarted: started, cause: nil)
        }
        finish(.failure(failure))
    }
}

/// Passes an exchange's connection reports on to it, holding it weakly. A connection holds its handler
/// strongly (`HTTPClientConnection.handler`): were the exchange its own connection's handler, the
/// connection would keep it alive after its owner let go of it without `cancel()`, and it would run to its
/// deadline and report to that owner; its deinit, which closes the connection, would never run. One
/// exchange per token-endpoint call, not per proxied request: the weak reference costs nothing that matters.
private final class ExchangeReports: HTTPClientConnectionReportForwarding {
    private(set) weak var reportTarget: HTTPExchange?

    init(_ exchange: HTTPExchange) {
        reportTarget = exchange
    }
}
