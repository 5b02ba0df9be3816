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

/// A response head as received: one copy of its bytes and HTTPWire's offsets into them.
public struct ReceivedResponseHead: Sendable {
    public let bytes: [UInt8]
    public let parsed: ResponseHead

    public var status: Int { parsed.status }
    public var version: HTTPVersion { parsed.semantics.version }
    public var framing: BodyFraming { parsed.semantics.framing }
    public var reason: String { String(decoding: bytes[parsed.reason], as: UTF8.self) }

    public func forEachField(_ body: (ArraySlice<UInt8>, ArraySlice<UInt8>) -> Void) {
        for field in parsed.fields { body(bytes[field.name], bytes[field.value]) }
    }

    public func field(_ name: String) -> String? {
        let wanted = Array(name.utf8)
        for field in parsed.fields where asciiEqualIgnoringCase(bytes[field.name], wanted) {
            return String(decoding: bytes[field.value], as: UTF8.self)
        }
        return nil
    }
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
    private(set) var connectFailureCause: ConnectFailureCause?

    /// Held strongly until the connection ends (after its `ended` report) or another is set; the pool
    /// clears it on release. Not `weak`: a weak reference gives the handler a side table, which makes every
    /// retain and release of it slow, and a handler is touched several times per response. A handler that
    /// holds its connection forms a cycle only until the end, or until it lets go (`handler = nil`).
    public var handler: HTTPClientConnectionHandler?
    /// The host as given (a name or an IP literal) and port.
    public let host: String
    public let port: UInt16
    /// The address connected to (the one being tried while connecting); nil while the name resolves.
    public private(set) var remote: PeerAddress?
    public var sendBufferLimit = 1 << 20

    let stream: SocketStream
    private var parser: HeadParser
    private var head = ResponseHead()
    /// The last response head's bytes, handed to the handler (see `refillHeadBytes`).
    private var headBytes: [UInt8] = []
    private var chunked: ChunkedDecoder
    private let limits: HTTPWireLimits

    private enum State {
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
    private var state = State.idle
    /// The status of an answer the upstream had sent but that was not read yet when the connection failed
    /// before a response (plain TCP only; for the log). An upstream that answers an upload early (a 401)
    /// and closes without reading the rest of the body resets the connection, and the failed write of the
    /// body is seen before its answer is read.
    public private(set) var statusUnreadAtFailure: Int?
    private var requestMethod = HTTPMethod.get
    private var requestFraming: ResponseFraming?
    private var requestBodySent = 0
    /// A request head not written yet (empty when there is none): it goes out with the first body piece.
    /// The buffer keeps its capacity for the next head.
    private let pendingHead = HeadBuffer()
    private var responseStarted = false
    private var keepAlive = true
    /// Framed body bytes (and the end of the body) given while waiting for 100 Continue.
    private var heldBody: [UInt8] = []
    private var finishHeld = false
    /// A final response came before the body was released: the body is never sent.
    private var bodyAbandoned = false
    /// The request's body did not match its framing (short, or more than announced): whatever the
    /// response says, the connection is not reused.
    private var requestFramingBroken = false
    private var continueTimer: TransportTimer?
    /// The client connection the current response's body is to be spliced to, once the bytes read with
    /// the head have gone the normal way; the splice while it runs.
    /// Strong (no side table on the client connection); cleared when the splice starts or is given up,
    /// when the response completes and when this connection ends, so it never outlives the response.
    private var spliceTarget: HTTPServerConnection?
    private var spliceMinimum = 0
    private var splice: BodySplice?
    /// The handler's pause, kept apart from the splice's own control of reading.
    private var readingPausedByHandler = false
    /// Responses whose body (the rest after the bytes read with the head) went by splice, and the bytes.
    public private(set) var splicedResponses = 0
    public private(set) var splicedBytes = 0

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
    public private(set) var continueState = ContinueState.notExpected
    /// Body bytes of the current request handed to the socket (bytes held for 100 Continue do not count).
    public private(set) var requestBodyBytesSent = 0
    /// `requestBodyBytesSent` when the final response head arrived: 0 means no body byte had left, so a
    /// streamed body has not been consumed and the request can be sent again (after a 401, say).
    public private(set) var bodyBytesSentBeforeResponse = 0
    private var hasEnded = false
    private var processing = false
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

    private let loop: TransportLoop
    private var silenceTimer: TransportTimer?
    private var silenceLimit: Double?

    // Connecting
    private var lookup: NameLookup?
    private var resolvedAtOnce = false
    /// Addresses not tried yet, in the resolver's order.
    private var candidates: [SocketAddress] = []
    private var lastConnectFailure: String?
    private var connected = false
    private var connectTimer: TransportTimer?
    private var connectTimeout: Double = 0
    private var initializing = true
    private var failureDuringInit: String?

    private func resolved(_ outcome: NameLookup.Outcome) {
        lookup = nil
        resolvedAtOnce = initializing
        guard !hasEnded else { return }
        switch outcome {
        case .failed(let reason):
            connectFailed("cannot resolve \(host): \(reason)", cause: .nameResolution)
        case .addresses(let addresses):
            candidates = addresses
            tryNextAddress()
        }
    }

    /// Connects to the next address; when none is left, the connection fails with the last cause.
    private func tryNextAddress() {
        while !candidates.isEmpty {
            let address = candidates.removeFirst()
            var storage = address.storage
            remote = PeerAddress(&storage)
            let target = remote?.description ?? "\(host):\(port)"
            if let error = stream.connect(to: address) {
                lastConnectFailure = "connect \(target): \(String(cString: strerror(error)))"
                continue
            }
            return
        }
        connectFailed(lastConnectFailure ?? "connect \(host):\(port): no address to try", cause: .connect)
    }

    private func connectFailed(_ description: String, cause: ConnectFailureCause) {
        guard !hasEnded else { return }
        connectFailureCause = cause
        if initializing {
            failureDuringInit = description
            return
        }
        end(.connectFailed(description))
        closeNow()
    }

    private func connectTimeExpired() {
        guard !connected, !hasEnded else { return }
        let whole = connectTimeout.rounded() == connectTimeout && connectTimeout < 1e9
        let limit = whole ? "\(Int(connectTimeout)) s" : "\(connectTimeout) s"
        if lookup != nil {
            connectFailed("cannot resolve \(host): no answer within \(limit)", cause: .timedOut)
        } else if stream.isHandshaking {
            connectFailed("TLS handshake with \(remote?.description ?? host) did not finish within \(limit)", cause: .timedOut)
        } else {
            connectFailed("connect \(remote?.description ?? host) did not finish within \(limit)", cause: .timedOut)
        }
    }

    /// Closes the socket, and forgets a lookup still running (its answer must not reach a closed connection).
    private func closeNow() {
        lookup?.cancel()
        lookup = nil
        stream.close()
    }

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

    private func rearmSilence() {
        guard let seconds = silenceLimit, requestOutstanding, !hasEnded else {
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
    public private(set) var requestsStarted = 0

    /// Sends a request head. `target` is sent byte for byte. Framing fields are written by the transport.
    /// `continueWait`: send `Expect: 100-continue` (replacing any Expect field given) and hold the body
    /// until `100 Continue` or for at most this many seconds; ignored for a request without a body.
    /// `upgrade`: ask to switch to this protocol (`Upgrade: <value>` and `Connection: Upgrade` are written;
    /// a bodiless request only). A `101` answer then leaves the connection in the switched state.
    public func startRequest(method: String, target: [UInt8], fields: [(name: String, value: String)], body: BodyLength,
                             continueWait: Double? = nil, upgrade: String? = nil) {
        startRequest(method: method, target: target, body: body, continueWait: continueWait, upgrade: upgrade) { block in
            for field in fields { block.append(name: field.name, value: field.value) }
        }
    }

    /// `startRequest` with the fields `fields` writes straight into the head (see `HTTPFieldBlock`).
    public func startRequest(method: String, target: [UInt8], body: BodyLength, continueWait: Double? = nil, upgrade: String? = nil,
                             fields: (inout HTTPFieldBlock) -> Void) {
        guard !hasEnded, case .idle = state else { return }
        requestMethod = HTTPMethod(name: method)
        requestsStarted += 1
        state = .awaitingHead
        responseStarted = false
        heldBody = []
        finishHeld = false
        bodyAbandoned = false
        requestFramingBroken = false
        requestBodyBytesSent = 0
        bodyBytesSentBeforeResponse = 0
        let expectContinue: Bool
        switch body {
        case .none, .known(0): expectContinue = false
        default: expectContinue = continueWait != nil
        }
        continueState = expectContinue ? .waiting : .notExpected
        rearmSilence()
        let framing: ResponseFraming
        switch body {
        case .none: framing = .none
        case .known(let n): framing = .length(n)
        case .unknown: framing = .chunked
        }
        requestFraming = framing
        requestBodySent = 0
        let out = pendingHead
        out.clear()
        var method = method
        method.withUTF8 { out.append(UnsafeRawBufferPointer($0)) }
        out.append(0x20)
        target.withUnsafeBytes { out.append($0) }
        out.append(literal: " HTTP/1.1\r\n")
        var block = HTTPFieldBlock(writingInto: out)
        block.dropsExpect = expectContinue
        fields(&block)
        block.endField()
        if expectContinue { out.append(literal: "Expect: 100-continue\r\n") }
        if let upgrade, body == .none, isSendableField("Upgrade", upgrade) {
            out.append(literal: "Upgrade: ")
            var upgrade = upgrade
            upgrade.withUTF8 { out.append(UnsafeRawBufferPointer($0)) }
            out.append(literal: "\r\nConnection: Upgrade\r\n")
        }
        switch framing {
        case .length(let n):
            out.append(literal: "Content-Length: ")
            out.appendDecimal(n)
            out.append(literal: "\r\n")
        case .chunked:
            out.append(literal: "Transfer-Encoding: chunked\r\n")
        case .none, .closeDelimited:
            break
        }
        out.append(literal: "\r\n")
        if framing == .none || framing == .length(0) || expectContinue {
            stream.write(out.bytes)
            out.clear()
        }
        if expectContinue, let continueWait {
            if continueTimer == nil {
                continueTimer = TransportTimer(loop: loop) { [unowned self] in self.releaseHeldBody(.waitExpired) }
            }
            continueTimer?.schedule(after: continueWait)
        }
    }

    /// Writes the body held for 100 Continue (and its end, if the request was finished meanwhile).
    private func releaseHeldBody(_ outcome: ContinueState) {
        guard continueState == .waiting, !hasEnded else { return }
        continueTimer?.cancel()
        continueState = outcome
        let held = heldBody
        heldBody = []
        requestBodyBytesSent = requestBodySent
        stream.write(held)
        if finishHeld {
            finishHeld = false
            finishRequest()
        }
        handler?.connectionCanSendMore(self)
    }

    public func sendBody(_ bytes: UnsafeRawBufferPointer) {
        guard !hasEnded, !bodyAbandoned, let framing = requestFraming, bytes.count > 0 else { return }
        var bytes = bytes
        if case .length(let n) = framing {
            // Never more than announced: the upstream would read the excess as the next request.
            let left = max(0, n - requestBodySent)
            if bytes.count > left {
                requestFramingBroken = true
                bytes = UnsafeRawBufferPointer(rebasing: bytes[0..<left])
            }
            if bytes.count == 0 { return }
        }
        requestBodySent += bytes.count
        if continueState == .waiting {
            // Framed now, written when released; the caller was told not to send (`canSendMore`), so
            // this holds only what it had in hand.
            if framing == .chunked {
                heldBody.append(contentsOf: String(bytes.count, radix: 16).utf8)
                heldBody.append(contentsOf: [0x0D, 0x0A])
                heldBody.append(contentsOf: bytes)
                heldBody.append(contentsOf: [0x0D, 0x0A])
            } else {
                heldBody.append(contentsOf: bytes)
            }
            return
        }
        requestBodyBytesSent += bytes.count
        writeBodyPiece(bytes, after: pendingHead.bytes, chunked: framing == .chunked, to: stream)
        pendingHead.clear()
    }

    public func sendBody(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { sendBody($0) }
    }

    /// Ends the request. A body shorter or longer than its announced length leaves the connection
    /// unusable for another request (the upstream would read the difference as part of the next one).
    public func finishRequest() {
        guard !hasEnded, !bodyAbandoned, let framing = requestFraming else { return }
        if continueState == .waiting {
            finishHeld = true
            return
        }
        var last: StaticString = ""
        switch framing {
        case .chunked: last = "0\r\n\r\n"
        case .length(let n) where n != requestBodySent: requestFramingBroken = true
        default: break
        }
        last.withUTF8Buffer { stream.write(parts: pendingHead.bytes, UnsafeRawBufferPointer($0)) }
        pendingHead.clear()
        requestFraming = nil
    }

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
        if splice == nil { stream.pauseReading() }
    }

    public func resumeReading() {
        readingPausedByHandler = false
        if splice == nil { stream.resumeReading() }
    }

    // MARK: - Splicing

    /// Asks for the rest of the current response's body to be moved to `client` with splice(2), kernel to
    /// kernel, instead of through `receivedBody`. Call it from `receivedHead`, after `client.startResponse`
    /// with the same length. The bytes read together with the head still come through `receivedBody`
    /// first (the caller sends them as usual); then, if at least `minimumBytes` remain, the splice takes
    /// over (its bytes follow whatever is still queued for the client) and the next report is `connectionReceivedEnd` (or the
    /// connection's end, if either side fails). Returns false, and nothing changes, unless both
    /// connections are plain TCP, the response is framed by its length and the client's response
    /// announced the same length (not to HEAD). The splice paces the upstream by the client itself: a
    /// pause from before it is lifted when it starts, and while it runs `pauseReading` and
    /// `resumeReading` only record the wish (applied when it ends).
    public func spliceBody(to client: HTTPServerConnection, minimumBytes: Int = 64 * 1024) -> Bool {
        guard !hasEnded, splice == nil, case .lengthBody(let remaining) = state, stream.isOpen, !stream.usesTLS,
              client.spliceableBodyOwed == remaining else { return false }
        spliceTarget = client
        spliceMinimum = max(minimumBytes, 1)
        return true
    }

    /// Starts the splice asked for, once the input buffer is empty; false when it cannot start now.
    private func startSplice(remaining: Int) -> Bool {
        guard let client = spliceTarget else { return false }
        guard remaining >= spliceMinimum, stream.isOpen, client.spliceableBodyOwed == remaining else {
            spliceTarget = nil
            return false
        }
        // The head, and body bytes still queued for the client, go before any spliced byte (`BodySplice`).
        client.flushPendingHead()
        guard client.stream.isOpen else {
            spliceTarget = nil
            return false
        }
        guard let pipe = loop.splicePipes.take() else {
            spliceTarget = nil
            return false
        }
        spliceTarget = nil
        readingPausedByHandler = false
        state = .splicedBody
        splicedResponses += 1
        let splice = BodySplice(owner: self, source: stream, client: client, pipe: pipe, pool: loop.splicePipes, remaining: remaining)
        self.splice = splice
        splice.start()
        return true
    }

    func spliceReceived(_ n: Int) {
        splicedBytes += n
        rearmSilence()
    }

    /// The whole body went through: the response is complete as if it had been read.
    func spliceFinished() {
        endSplice()
        guard !hasEnded, case .splicedBody = state else { return }
        state = .idle
        responseComplete()
        rearmSilence()
    }

    /// The upstream closed before the whole body came.
    func spliceSourceEnded() {
        endSplice()
        streamReachedEnd(stream)
    }

    /// The client went away mid-body: this connection holds the rest of a body nobody takes.
    func spliceLostClient() {
        endSplice()
        guard !hasEnded else { return }
        keepAlive = false
        closeNow()
    }

    private func endSplice() {
        guard let splice else { return }
        self.splice = nil
        splice.stop()
        guard !stream.isClosed else { return }
        if readingPausedByHandler { stream.pauseReading() } else { stream.resumeReading() }
    }

    // MARK: - Receiving

    private func process() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        // The stream and its buffer are the connection's for life: one reference for the whole loop.
        let input = stream.input
        while !hasEnded {
            switch state {
            case .ended, .switched, .splicedBody:
                return
            case .idle:
                // Nothing may arrive between responses: a stray response would answer the next request.
                if input.count > 0 {
                    onUnsolicitedBytes?(input.count)
                    end(.unsolicitedBytes)
                    stream.close()
                }
                return
            case .awaitingHead:
                guard input.count > 0 else { return }
                responseStarted = true
                do {
                    guard try parser.parseResponse(input.unconsumed, requestMethod: requestMethod, into: &head) else { return }
                } catch {
                    protocolFailure(error)
                    return
                }
                refillHeadBytes(&headBytes, from: input, count: head.headLength)
                input.consume(head.headLength)
                if head.isInformational && head.status != 101 {
                    handler?.connection(self, receivedInformational: head.status)
                    if head.status == 100 { releaseHeldBody(.received) }
                    continue
                }
                bodyBytesSentBeforeResponse = requestBodyBytesSent
                if continueState == .waiting {
                    // The final answer came before the body was asked for: it is never sent, and the
                    // upstream may still be waiting for it, so the connection is not reused.
                    continueTimer?.cancel()
                    continueState = .finalResponseFirst
                    heldBody = []
                    finishHeld = false
                    bodyAbandoned = true
                }
                keepAlive = head.semantics.keepAlive && head.status != 101 && !bodyAbandoned
                if head.status == 101 {
                    state = .switched
                    handler?.connection(self, receivedHead: ReceivedResponseHead(bytes: headBytes, parsed: head))
                    continue
                }
                switch head.semantics.framing {
                case .length(let n): state = n == 0 ? .idle : .lengthBody(remaining: n)
                case .chunked: state = .chunkedBody; chunked = ChunkedDecoder(limits: limits)
                case .untilClose: state = .bodyUntilClose; keepAlive = false
                case .none: state = .idle
                }
                handler?.connection(self, receivedHead: ReceivedResponseHead(bytes: headBytes, parsed: head))
                if case .idle = state { responseComplete() }
            case .lengthBody(let remaining):
                if input.count == 0, spliceTarget != nil, startSplice(remaining: remaining) { continue }
                guard input.count > 0 else { return }
                let take = min(remaining, input.count)
                handler?.connection(self, receivedBody: UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(input.unconsumed)[0..<take]))
                input.consume(take)
                if take == remaining {
                    state = .idle
                    responseComplete()
                } else {
                    state = .lengthBody(remaining: remaining - take)
                }
            case .chunkedBody:
                guard input.count > 0 else { return }
                let used: Int
                do {
                    used = try chunked.decode(UnsafeRawBufferPointer(input.unconsumed)) { piece in
                        handler?.connection(self, receivedBody: piece)
                    }
                } catch {
                    protocolFailure(error)
                    return
                }
                input.consume(used)
                if chunked.isComplete {
                    state = .idle
                    responseComplete()
                }
            case .bodyUntilClose:
                guard input.count > 0 else { return }
                handler?.connection(self, receivedBody: UnsafeRawBufferPointer(input.unconsumed))
                input.consume(input.count)
            }
        }
    }

    private func responseComplete() {
        // Bytes already buffered behind a complete response: never reuse (and the handler sees it). Nor
        // when the response came before the request body was all sent (an early 401 or 413): the rest of
        // that body would be read by the upstream as the next request.
        spliceTarget = nil
        let unsolicited = stream.input.count > 0
        if unsolicited { onUnsolicitedBytes?(stream.input.count) }
        if unsolicited || requestFraming != nil || requestFramingBroken || bodyAbandoned { keepAlive = false }
        handler?.connectionReceivedEnd(self)
        if unsolicited { end(.unsolicitedBytes) }   // reported before the close, which would say closedLocally
        if !keepAlive { stream.close() }           // idempotent if the handler closed it already
    }

    /// A response that breaks the protocol: the connection cannot be trusted.
    private func protocolFailure(_ error: HTTPWireError) {
        keepAlive = false
        end(.protocolError(error))
        stream.close()
    }

    private func end(_ reason: ConnectionEnd) {
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

extension HTTPClientConnection: SocketStreamOwner {
    func streamReceived(_ stream: SocketStream) {
        process()
        rearmSilence()
    }

    func streamReachedEnd(_ stream: SocketStream) {
        if case .bodyUntilClose = state {
            state = .idle
            handler?.connectionReceivedEnd(self)
        }
        end(.peerClosed)
        stream.close()
    }

    func streamFailed(_ stream: SocketStream, errno: Int32) {
        if !responseStarted { statusUnreadAtFailure = stream.peekStatusCode() }
        end(.failed(errno: errno))
        // Closed here, while this connection is surely alive: the handler told of the end may have let go of
        // it, and the stream's own close after this call would then find no owner, so `onClosed` would never
        // run and the pool would count the slot as taken for ever (one leaked slot per reset upstream).
        stream.close()
    }

    func streamDrained(_ stream: SocketStream) {
        handler?.connectionCanSendMore(self)
    }

    func streamConnected(_ stream: SocketStream) {
        connected = true
        connectTimer?.cancel()
        let told = onConnected
        onConnected = nil
        told?()
    }

    func streamConnectFailed(_ stream: SocketStream, errno: Int32, reason: String, duringHandshake: Bool) {
        let target = remote?.description ?? "\(host):\(port)"
        if duringHandshake {
            connectFailed("TLS handshake with \(target) failed: \(reason)",
                          cause: .tlsHandshake(reason: reason, certificateRejected: stream.rejectedPeerCertificate))
        } else {
            lastConnectFailure = "connect \(target): \(reason)"
            tryNextAddress()
        }
    }

    func streamClosed(_ stream: SocketStream) {
        end(.closedLocally)
        let closed = onClosed
        onClosed = nil
        closed?()
    }
}
