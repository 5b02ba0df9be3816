import CLibevent
import HTTPWire
import Glibc

/// Moving the rest of a response body to a client connection with splice(2) (see `BodySplice`): asked for,
/// started once the bytes read with the head have gone, and the splice's reports. Apart from
/// `HTTPClientConnection.swift` because only large plain-TCP responses take this path.
extension HTTPClientConnection {
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
    func startSplice(remaining: Int) -> Bool {
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

    func spliceHoldsSource(_ held: Bool) {
        guard held != spliceHeldSource else { return }
        spliceHeldSource = held
        rearmSilence()
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
        spliceHeldSource = false
        splice.stop()
        guard !stream.isClosed else { return }
        if readingPausedByHandler { stream.pauseReading() } else { stream.resumeReading() }
    }
}
