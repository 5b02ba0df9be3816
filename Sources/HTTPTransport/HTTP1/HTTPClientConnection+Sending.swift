import CLibevent
import HTTPWire
import Glibc

/// The request side: the head (held back to go out with the first body piece, or at once when 100 Continue
/// is awaited), the body in its framing, the body held for 100 Continue, and the finish. Apart from
/// `HTTPClientConnection.swift` (state, reuse, the end) and `+Receiving` so that each direction reads alone.
extension HTTPClientConnection {
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
    func releaseHeldBody(_ outcome: ContinueState) {
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
}
