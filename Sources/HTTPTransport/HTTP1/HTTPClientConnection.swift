import CLibevent
import HTTPWire
import Glibc

/// What an upstream connection reports, on the loop's thread, for the request in flight.
public protocol HTTPClientConnectionHandler: AnyObject {
    /// An interim response (100 Continue, 103 Early Hints); the final one follows.
    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int)
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead)
    /// A piece of the response body (de-chunked). Valid only during the call.
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer)
    /// The response is complete. `connection.isReusable` says whether it may carry another request.
    func connectionReceivedEnd(_ connection: HTTPClientConnection)
    /// Request bytes that had to wait have been written.
    func connectionCanSendMore(_ connection: HTTPClientConnection)
    /// The connection is gone. `responseStarted` says whether any byte of a response had arrived (a
    /// request that failed before that may be retried on a fresh connection, within the retry rules).
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool)
}

/// One connection to an upstream, one request at a time (no pipelining), kept alive between requests.
///
/// Connecting is part of the connection's life: a host name is resolved on the loop's resolver (an IP
/// literal is used as is), each address is tried in turn, and with a TLS context the handshake follows.
/// A request can be started at once; its bytes wait until all that is done. Anything that fails on the
/// way ends the connection as `.connectFailed` with the cause in words, and nothing of the request has
/// reached the upstream then.
///
/// A request with a body may be sent with `Expect: 100-continue` (`startRequest(..., continueWait:)`):
/// the head goes out at once and the body is held until the upstream answers `100 Continue`, or until
/// `continueWait` seconds pass without an answer (an upstream that ignores the expectation gets the body
/// anyway), or a final response arrives first, in which case the body is never sent (a 401 then costs
/// nothing to replay) and the connection is not reused (the upstream may still expect the body).
/// `requestBodyBytesSent` and `bodyBytesSentBeforeResponse` tell the caller whether any of the body left.
///
/// A connection is reusable only if the last response was complete, allowed keep-alive, and nothing
/// followed it: bytes after a complete response (a second response in the same write, or a body on a 304)
/// would otherwise be read as the answer to the next client's request.
public final class HTTPClientConnection {
    // State the extensions in HTTPClientConnection+Connect/+Sending/+Receiving/+Splice.swift read and set is
    // internal, not private (a `private` member is visible only in this file); nothing outside the connection
    // sets it.
    public struct ConnectError: Error, CustomStringConvertible {
        public let description: String
        /// The kind of failure, for callers inside the transport that report it (`HTTPExchange`).
        var cause: ConnectFailureCause? = nil
    }

    /// Why connecting failed, beside the text of `.connectFailed`.
    enum ConnectFailureCause: Equatable {
        case nameResolution
        /// No address accepted the connection (refused, unreachable, no socket).
        case connect
        /// The connect timeout passed (resolving, connecting or handshaking).
        case timedOut
        /// `reason` without the "TLS handshake with ... failed" frame; `certificateRejected`: our
        /// verification refused the peer's certificate.
        case tlsHandshake(reason: String, certificateRejected: Bool)
    }
    /// Set when the connection ends as `.connectFailed` (or the initializer throws).
    var connectFailureCause: ConnectFailureCause?
    /// `h2` was offered in ALPN beside `http/1.1` (`upstream.http2` "alpn", on the HTTP/1.1 path).
    let offersHTTP2: Bool
    /// The server selected h2 although this connection speaks HTTP/1.1: the upstream changed since it chose
    /// HTTP/1.1. The connection ended as `.connectFailed` before its request went out (nothing processed),
    /// so the request may go again, over HTTP/2.
    public internal(set) var serverSelectedHTTP2 = false

    /// Held strongly until the connection ends (after its `ended` report) or another is set; the pool
    /// clears it on release. Not `weak`: a weak reference gives the handler a side table, which makes every
    /// retain and release of it slow, and a handler is touched several times per response. A handler that
    /// holds its connection forms a cycle only until the end, or until it lets go (`handler = nil`).
    public var handler: HTTPClientConnectionHandler?
    /// The host as given (a name or an IP literal) and port.
    public let host: String
    public let port: UInt16
    /// The address connected to (the one being tried while connecting); nil while the name resolves.
    public internal(set) var remote: PeerAddress?
    public var sendBufferLimit = 1 << 20

    let stream: SocketStream
    var parser: HeadParser
    var head = ResponseHead()
    /// The last response head's bytes, handed to the handler (see `refillHeadBytes`).
    var headBytes: [UInt8] = []
    var chunked: ChunkedDecoder
    let limits: HTTPWireLimits

    enum State {
        case idle
        /// A request is being sent or has been sent; no response byte yet.
        case awaitingHead
        case lengthBody(remaining: Int)
        case chunkedBody
        case bodyUntilClose
        /// The rest of a length-framed body is being spliced to a client connection (`BodySplice`).
        case splicedBody
        /// A 101 arrived: what follows is not HTTP. Nothing more is parsed; `detachForTunnel` hands the
        /// socket over.
        case switched
        case ended
    }
    var state = State.idle
    /// The status of an answer the upstream had sent but that was not read yet when the connection failed
    /// before a response (plain TCP only; for the log). An upstream that answers an upload early (a 401)
    /// and closes without reading the rest of the body resets the connection, and the failed write of the
    /// body is seen before its answer is read.
    public internal(set) var statusUnreadAtFailure: Int?
    var requestMethod = HTTPMethod.get
    var requestFraming: ResponseFraming?
    var requestBodySent = 0
    /// A request head not written yet (empty when there is none): it goes out with the first body piece.
    /// The buffer keeps its capacity for the next head.
    let pendingHead = HeadBuffer()
    var responseStarted = false
    var keepAlive = true
    /// Framed body bytes (and the end of the body) given while waiting for 100 Continue.
    var heldBody: [UInt8] = []
    var finishHeld = false
    /// A final response came before the body was released: the body is never sent.
    var bodyAbandoned = false
    /// The request's body did not match its framing (short, or more than announced): whatever the
    /// response says, the connection is not reused.
    var requestFramingBroken = false
    var continueTimer: TransportTimer?
    /// The client connection the current response's body is to be spliced to, once the bytes read with
    /// the head have gone the normal way; the splice while it runs.
    /// Strong (no side table on the client connection); cleared when the splice starts or is given up,
    /// when the response completes and when this connection ends, so it never outlives the response.
    var spliceTarget: HTTPServerConnection?
    var spliceMinimum = 0
    var splice: BodySplice?
    /// The handler's pause, kept apart from the splice's own control of reading.
    var readingPausedByHandler = false
    /// The splice stops reading the upstream while its pipe is full (the client is slow), as a paused
    /// handler does: the silence limit waits for it to read again (`spliceHoldsSource`).
    var spliceHeldSource = false
    /// Responses whose body (the rest after the bytes read with the head) went by splice, and the bytes.
    public internal(set) var splicedResponses = 0
    public internal(set) var splicedBytes = 0

    /// Where the current request stands with `Expect: 100-continue`.
    public enum ContinueState: Sendable, Equatable {
        /// Sent without the expectation.
        case notExpected
        /// The head is sent; the body is held until an answer or the wait's end.
        case waiting
        /// The upstream answered 100 Continue; the body was released.
        case received
        /// No answer within `continueWait`; the body was released anyway.
        case waitExpired
        /// A final response arrived first; the body was not sent and will not be.
        case finalResponseFirst
    }
    public internal(set) var continueState = ContinueState.notExpected
    /// Body bytes of the current request handed to the socket (bytes held for 100 Continue do not count).
    public internal(set) var requestBodyBytesSent = 0
    /// `requestBodyBytesSent` when the final response head arrived: 0 means no body byte had left, so a
    /// streamed body has not been consumed and the request can be sent again (after a 401, say).
    public internal(set) var bodyBytesSentBeforeResponse = 0
    var hasEnded = false
    var processing = false
    /// Set by `UpstreamPool`: told once when the socket is closed, whoever holds the connection then.
    var onClosed: (() -> Void)?
    /// Set by `UpstreamPool`: told when bytes arrived that belong to no response (whoever holds the
    /// connection then, the pool included).
    var onUnsolicitedBytes: ((Int) -> Void)?
    /// Set by `HTTP2ClientConnection`, which connects through this class and then takes the socket over
    /// (`detachConnected`): told once the connection (and its TLS handshake) is up.
    var onConnected: (() -> Void)?

    /// Starts connecting to `host` (a name, resolved without blocking the loop, or an IP literal); the
    /// request can be sent at once (it waits for the connect and the handshake).
    ///
    /// - Parameters:
    ///   - tls: talk TLS with this context (SNI and the verified name: its `serverName`, else `host`).
    ///   - connectTimeout: longest the whole connect may take (resolving, TCP, TLS handshake); nil: no limit
    ///     of its own (the silence limit, when set, still covers it).
    /// - Throws: only what fails at once (a malformed host, no socket, an address refused on the spot);
    ///   everything later ends the connection as `.connectFailed`.
    public init(loop: TransportLoop, host: String, port: UInt16, limits: HTTPWireLimits = HTTPWireLimits(),
                inputCapacity: Int = 64 * 1024, tls: TransportTLSClientContext? = nil,
                connectTimeout: Double? = nil, alpn: [String] = []) throws(ConnectError) {
        var session: TLSSession?
        if let tls {
            guard let made = tls.makeSession(host: host) else {
                throw ConnectError(description: "\(host): cannot be used as a TLS server name")
            }
            if !alpn.isEmpty && !made.offerProtocols(alpn) {
                throw ConnectError(description: "\(host): cannot offer \(alpn.joined(separator: ", ")) in ALPN")
            }
            session = made
        }
        self.host = host
        self.port = port
        offersHTTP2 = alpn.contains("h2")
        self.limits = limits
        parser = HeadParser(limits: limits)
        chunked = ChunkedDecoder(limits: limits)
        stream = SocketStream(loop: loop, inputCapacity: max(inputCapacity, limits.maxHeadBytes), tls: session)
        self.loop = loop
        stream.owner = self
        if let connectTimeout {
            self.connectTimeout = connectTimeout
            // Timers and the lookup are owned by this connection and never call back once it is gone
            // (a timer's deinit, `lookup.cancel()` in deinit): unowned, so no side table (see `handler`).
            connectTimer = TransportTimer(loop: loop) { [unowned self] in self.connectTimeExpired() }
            connectTimer?.schedule(after: connectTimeout)
        }
        if let address = SocketAddress(host: host, port: port) {
            candidates = [address]
            tryNextAddress()
        } else {
            guard NameLookup.isHostName(host) else {
                throw ConnectError(description: "\(host): not a host name or IP address")
            }
            let lookup = NameLookup.start(loop: loop, host: host, port: port) { [unowned self] outcome in
                self.resolved(outcome)
            }
            if !resolvedAtOnce { self.lookup = lookup }
        }
        // Failures before the handler could be set are thrown, not reported to nobody.
        initializing = false
        if let failure = failureDuringInit { throw ConnectError(description: failure, cause: connectFailureCause) }
    }

    let loop: TransportLoop
    private var silenceTimer: TransportTimer?
    private var silenceLimit: Double?

    // Connecting
    var lookup: NameLookup?
    var resolvedAtOnce = false
    /// Addresses not tried yet, in the resolver's order.
    var candidates: [SocketAddress] = []
    var lastConnectFailure: String?
    var connected = false
    var connectTimer: TransportTimer?
    var connectTimeout: Double = 0
    var initializing = true
    var failureDuringInit: String?

    deinit {
        lookup?.cancel()
        // A splice still running stops before the streams go: its reports must not reach this object.
        splice?.stop()
        stream.ownerLeaving(ObjectIdentifier(self))
    }

    /// Longest the upstream may stay silent while a request is outstanding: from the request until the
    /// first response byte (connecting included), and between any two reads of the response. nil (the
    /// default) waits for ever, as a long-lived event stream needs once its head has arrived. Takes effect
    /// at once; idle connections between requests are never timed out by it.
    public func setSilenceLimit(_ seconds: Double?) {
        silenceLimit = seconds
        // From a handler called while a read is processed the timer is armed once that read is done
        // (`streamReceived`): a response that is complete by then needs no timer at all.
        if processing && seconds != nil { return }
        rearmSilence()
    }

    private var requestOutstanding: Bool {
        switch state {
        case .idle, .ended, .switched: return false
        default: return true
        }
    }

    func rearmSilence() {
        // Paused by the handler (its client is slow), the upstream is unread, not silent: the limit runs
        // again from `resumeReading`, so a long response to a slow client is not cut for our own pause.
        let unread = splice == nil ? readingPausedByHandler : spliceHeldSource
        guard let seconds = silenceLimit, requestOutstanding, !hasEnded, !unread else {
            silenceTimer?.cancel()
            return
        }
        if silenceTimer == nil {
            silenceTimer = TransportTimer(loop: loop) { [unowned self] in self.silenceExpired() }
        }
        silenceTimer?.schedule(after: seconds)
    }

    private func silenceExpired() {
        guard requestOutstanding, !hasEnded else { return }
        end(.timedOut)
        closeNow()
    }

    /// Idle, alive, the last request was sent completely, and the last response left nothing behind.
    public var isReusable: Bool {
        if case .idle = state { return !hasEnded && keepAlive && requestFraming == nil && stream.input.count == 0 }
        return false
    }

    /// False while the body is held for 100 Continue: `connectionCanSendMore` follows when it is released.
    public var canSendMore: Bool { continueState != .waiting && stream.pendingOutput < sendBufferLimit }

    /// The connection is established: some byte has gone through it (a connect in progress moves none).
    public var isConnected: Bool { stream.hasMovedBytes }

    /// Requests started on this connection; above 1, the current one went out on a reused connection,
    /// which the upstream may have closed just as we sent (the keep-alive race).
    public internal(set) var requestsStarted = 0

    public func close() {
        closeNow()
    }

    /// The upstream answered 101 Switching Protocols: the socket leaves HTTP. It is never pooled again,
    /// and its pool hears of it now, as of a close: a tunnel may stay open for hours, and were it counted
    /// for the pool, open WebSockets would take the connections ordinary requests need (the owner bounds
    /// tunnels on its own). Bytes that came behind the 101 (a first frame) travel with the endpoint. nil in
    /// any other state.
    public func detachForTunnel() -> TunnelEndpoint? {
        guard !hasEnded, case .switched = state else { return nil }
        hasEnded = true
        state = .ended
        silenceTimer?.cancel()
        continueTimer?.cancel()
        connectTimer?.cancel()
        handler = nil
        let leftPool = onClosed
        onClosed = nil
        leftPool?()
        // The endpoint keeps the connection (the stream's owner) alive until the socket closes.
        return TunnelEndpoint(stream: stream) { [self] in withExtendedLifetime(self) {} }
    }

    /// The connected socket, before any request was sent on it, for another protocol to take over (HTTP/2
    /// with prior knowledge or after ALPN chose it). nil in any other state. The connection ends here, as
    /// for a tunnel: it reports nothing more.
    func detachConnected() -> TunnelEndpoint? {
        guard !hasEnded, connected, requestsStarted == 0, case .idle = state else { return nil }
        hasEnded = true
        state = .ended
        silenceTimer?.cancel()
        continueTimer?.cancel()
        connectTimer?.cancel()
        handler = nil
        onClosed = nil
        return TunnelEndpoint(stream: stream) { [self] in withExtendedLifetime(self) {} }
    }

    /// Response bytes read from the socket and not yet handed on (checked right after a head: whether its
    /// body has started to arrive with it).
    public var hasUnreadInput: Bool { stream.input.count > 0 }

    /// A 101 has arrived and the connection waits for `detachForTunnel` (or a close).
    public var hasSwitchedProtocols: Bool {
        if case .switched = state { return !hasEnded }
        return false
    }

    /// Stops reading the response (the receiver cannot take more yet); `resumeReading` continues.
    public func pauseReading() {
        readingPausedByHandler = true
        if splice == nil {
            stream.pauseReading()
            rearmSilence()
        }
    }

    public func resumeReading() {
        let wasPaused = readingPausedByHandler
        readingPausedByHandler = false
        if splice == nil {
            stream.resumeReading()
            if wasPaused { rearmSilence() }
        }
    }

    func end(_ reason: ConnectionEnd) {
        guard !hasEnded else { return }
        hasEnded = true
        let started = responseStarted
        state = .ended
        spliceTarget = nil
        if let splice {
            self.splice = nil
            splice.stop()
        }
        silenceTimer?.cancel()
        continueTimer?.cancel()
        connectTimer?.cancel()
        handler?.connection(self, ended: reason, responseStarted: started)
        // Nothing more is reported: the handler (and any cycle through it) is let go.
        handler = nil
    }
}
