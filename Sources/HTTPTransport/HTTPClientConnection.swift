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
/// A connection is reusable only if the last response was complete, allowed keep-alive, and nothing
/// followed it: bytes after a complete response (a second response in the same write, or a body on a 304)
/// would otherwise be read as the answer to the next client's request.
public final class HTTPClientConnection {
    public struct ConnectError: Error, CustomStringConvertible {
        public let description: String
    }

    public weak var handler: HTTPClientConnectionHandler?
    public let remote: PeerAddress
    public var sendBufferLimit = 1 << 20

    let stream: SocketStream
    private var parser: HeadParser
    private var head = ResponseHead()
    private var chunked: ChunkedDecoder
    private let limits: HTTPWireLimits

    private enum State {
        case idle
        /// A request is being sent or has been sent; no response byte yet.
        case awaitingHead
        case lengthBody(remaining: Int)
        case chunkedBody
        case bodyUntilClose
        case ended
    }
    private var state = State.idle
    private var requestMethod = HTTPMethod.get
    private var requestFraming: ResponseFraming?
    private var requestBodySent = 0
    /// A request head not written yet: it goes out with the first body piece.
    private var pendingHead: [UInt8]?
    private var responseStarted = false
    private var keepAlive = true
    private var hasEnded = false
    private var processing = false
    /// Set by `UpstreamPool`: told once when the socket is closed, whoever holds the connection then.
    var onClosed: (() -> Void)?

    /// Starts connecting to an IP address literal; the request can be sent at once (it waits for the connect).
    public init(loop: TransportLoop, host: String, port: UInt16, limits: HTTPWireLimits = HTTPWireLimits(),
                inputCapacity: Int = 64 * 1024) throws(ConnectError) {
        guard let address = SocketAddress(host: host, port: port) else {
            throw ConnectError(description: "\(host): not an IP address literal")
        }
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ConnectError(description: "socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let result = address.withSockaddr { Glibc.connect(fd, $0, $1) }
        if result != 0 && errno != EINPROGRESS {
            let message = String(cString: strerror(errno))
            Glibc.close(fd)
            throw ConnectError(description: "connect \(host):\(port): \(message)")
        }
        var storage = address.storage
        guard let remote = PeerAddress(&storage) else {
            Glibc.close(fd)
            throw ConnectError(description: "\(host): unsupported address")
        }
        self.remote = remote
        self.limits = limits
        parser = HeadParser(limits: limits)
        chunked = ChunkedDecoder(limits: limits)
        // While the connect is in progress, writes return EAGAIN and wait for writability, and a refused
        // connect surfaces as the error of the first read or write: no separate connect state is needed.
        stream = SocketStream(loop: loop, fd: fd, inputCapacity: max(inputCapacity, limits.maxHeadBytes))
        self.loop = loop
        stream.owner = self
    }

    private let loop: TransportLoop
    private var silenceTimer: TransportTimer?
    private var silenceLimit: Double?

    /// Longest the upstream may stay silent while a request is outstanding: from the request until the
    /// first response byte (connecting included), and between any two reads of the response. nil (the
    /// default) waits for ever, as a long-lived event stream needs once its head has arrived. Takes effect
    /// at once; idle connections between requests are never timed out by it.
    public func setSilenceLimit(_ seconds: Double?) {
        silenceLimit = seconds
        rearmSilence()
    }

    private var requestOutstanding: Bool {
        switch state {
        case .idle, .ended: return false
        default: return true
        }
    }

    private func rearmSilence() {
        guard let seconds = silenceLimit, requestOutstanding, !hasEnded else {
            silenceTimer?.cancel()
            return
        }
        if silenceTimer == nil {
            silenceTimer = TransportTimer(loop: loop) { [weak self] in self?.silenceExpired() }
        }
        silenceTimer?.schedule(after: seconds)
    }

    private func silenceExpired() {
        guard requestOutstanding, !hasEnded else { return }
        end(.timedOut)
        stream.close()
    }

    /// Idle, alive, the last request was sent completely, and the last response left nothing behind.
    public var isReusable: Bool {
        if case .idle = state { return !hasEnded && keepAlive && requestFraming == nil && stream.input.count == 0 }
        return false
    }

    public var canSendMore: Bool { stream.pendingOutput < sendBufferLimit }

    /// The connection is established: some byte has gone through it (a connect in progress moves none).
    public var isConnected: Bool { stream.hasMovedBytes }

    /// Requests started on this connection; above 1, the current one went out on a reused connection,
    /// which the upstream may have closed just as we sent (the keep-alive race).
    public private(set) var requestsStarted = 0

    /// Sends a request head. `target` is sent byte for byte. Framing fields are written by the transport.
    public func startRequest(method: String, target: [UInt8], fields: [(name: String, value: String)], body: BodyLength) {
        guard !hasEnded, case .idle = state else { return }
        requestMethod = HTTPMethod(name: method)
        requestsStarted += 1
        state = .awaitingHead
        responseStarted = false
        rearmSilence()
        let framing: ResponseFraming
        switch body {
        case .none: framing = .none
        case .known(let n): framing = .length(n)
        case .unknown: framing = .chunked
        }
        requestFraming = framing
        requestBodySent = 0
        var out: [UInt8] = []
        out.reserveCapacity(64 + target.count + fields.count * 32)
        out.append(contentsOf: method.utf8)
        out.append(0x20)
        out.append(contentsOf: target)
        out.append(contentsOf: " HTTP/1.1\r\n".utf8)
        for field in fields where isSendableField(field.name, field.value) {
            out.append(contentsOf: field.name.utf8)
            out.append(contentsOf: ": ".utf8)
            out.append(contentsOf: field.value.utf8)
            out.append(contentsOf: "\r\n".utf8)
        }
        switch framing {
        case .length(let n):
            out.append(contentsOf: "Content-Length: \(n)\r\n".utf8)
        case .chunked:
            out.append(contentsOf: "Transfer-Encoding: chunked\r\n".utf8)
        case .none, .closeDelimited:
            break
        }
        out.append(contentsOf: "\r\n".utf8)
        if framing == .none || framing == .length(0) {
            stream.write(out)
        } else {
            pendingHead = out
        }
    }

    public func sendBody(_ bytes: UnsafeRawBufferPointer) {
        guard !hasEnded, let framing = requestFraming, bytes.count > 0 else { return }
        requestBodySent += bytes.count
        let head = pendingHead ?? []
        pendingHead = nil
        head.withUnsafeBytes { headBytes in
            if framing == .chunked {
                writeChunk(bytes, after: headBytes, to: stream)
            } else {
                stream.write(parts: headBytes, bytes)
            }
        }
    }

    public func sendBody(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { sendBody($0) }
    }

    /// Ends the request. A body shorter or longer than its announced length leaves the connection
    /// unusable for another request (the upstream would read the difference as part of the next one).
    public func finishRequest() {
        guard !hasEnded, let framing = requestFraming else { return }
        let head = pendingHead ?? []
        pendingHead = nil
        var last: [UInt8] = []
        switch framing {
        case .chunked: last = Array("0\r\n\r\n".utf8)
        case .length(let n) where n != requestBodySent: keepAlive = false
        default: break
        }
        head.withUnsafeBytes { headBytes in last.withUnsafeBytes { stream.write(parts: headBytes, $0) } }
        requestFraming = nil
    }

    public func close() {
        stream.close()
    }

    /// Stops reading the response (the receiver cannot take more yet); `resumeReading` continues.
    public func pauseReading() { stream.pauseReading() }

    public func resumeReading() { stream.resumeReading() }

    // MARK: - Receiving

    private func process() {
        guard !processing else { return }
        processing = true
        defer { processing = false }
        while !hasEnded {
            let input = stream.input
            switch state {
            case .ended:
                return
            case .idle:
                // Nothing may arrive between responses: a stray response would answer the next request.
                if input.count > 0 {
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
                let headBytes = Array(UnsafeRawBufferPointer(input.unconsumed)[0..<head.headLength])
                input.consume(head.headLength)
                if head.isInformational && head.status != 101 {
                    handler?.connection(self, receivedInformational: head.status)
                    continue
                }
                keepAlive = head.semantics.keepAlive && head.status != 101
                switch head.semantics.framing {
                case .length(let n): state = n == 0 ? .idle : .lengthBody(remaining: n)
                case .chunked: state = .chunkedBody; chunked = ChunkedDecoder(limits: limits)
                case .untilClose: state = .bodyUntilClose; keepAlive = false
                case .none: state = .idle
                }
                handler?.connection(self, receivedHead: ReceivedResponseHead(bytes: headBytes, parsed: head))
                if case .idle = state { responseComplete() }
            case .lengthBody(let remaining):
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
        let unsolicited = stream.input.count > 0
        if unsolicited || requestFraming != nil { keepAlive = false }
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
        silenceTimer?.cancel()
        handler?.connection(self, ended: reason, responseStarted: started)
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
        end(.failed(errno: errno))
    }

    func streamDrained(_ stream: SocketStream) {
        handler?.connectionCanSendMore(self)
    }

    func streamClosed(_ stream: SocketStream) {
        end(.closedLocally)
        let closed = onClosed
        onClosed = nil
        closed?()
    }
}
