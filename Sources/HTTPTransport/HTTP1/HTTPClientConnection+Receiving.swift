import CLibevent
import HTTPWire
import Glibc

/// The response side: parsing what the socket delivered (heads, interim responses, length, chunked or
/// close-delimited bodies), the end of a response, and the socket's reports. Apart from
/// `HTTPClientConnection.swift` (state, reuse, the end) and `+Sending` so that each direction reads alone.
extension HTTPClientConnection {
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

    func responseComplete() {
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
        // Offered beside http/1.1 by a connection that speaks HTTP/1.1 itself (no `onConnected`: not one
        // handed over to HTTP/2), h2 selected means the server changed: learnt here, at each new connection,
        // so an upstream redeployed with HTTP/2 is spoken to over it again without a reload.
        if offersHTTP2 && onConnected == nil && stream.selectedProtocol == "h2" {
            serverSelectedHTTP2 = true
            return connectFailed("\(remote?.description ?? host) selected h2 in ALPN", cause: .connect)
        }
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

/// A response head as received: one copy of its bytes and HTTPWire's offsets into them.
///
/// Declared here, beside `process()`, which makes one per response and drops it: a release build compiles
/// each source file to its own object, and only in the object that holds the type can the destroy of its
/// two arrays be inlined into `process()` (declared in another file, the drop went through the type's value
/// witness: 11 more instructions per proxied request in bench/profile.sh).
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
