import CLibevent
import Glibc

/// Reading: the persistent read event's handler, pausing and resuming it, and reading through OpenSSL.
/// Apart from `SocketStream.swift` (the state and the close) and `+Write` so that each direction reads alone.
extension SocketStream {
    /// Stops asking for input (the buffer is full, or the consumer applies backpressure). Rare by design:
    /// the steady state never touches the read registration.
    func pauseReading() {
        guard !readingPaused, !isClosed else { return }
        readingPaused = true
        if phase == .open, let readEvent { event_del(readEvent) }
    }

    func resumeReading() {
        guard readingPaused, !isClosed else { return }
        readingPaused = false
        guard phase == .open, let readEvent else { return }
        event_add(readEvent, nil)
        // Input OpenSSL already holds will not make the socket readable again.
        if tls?.hasBufferedInput == true { event_active(readEvent, Int32(EV_READ), 0) }
    }

    func readable() {
        guard !isClosed else { return }
        switch phase {
        case .unconnected, .connecting:
            return
        case .handshaking:
            if let tls { continueHandshake(tls) }
            return
        case .open:
            break
        }
        if let spliceSource {
            spliceSource.sourceReadable()
            return
        }
        if let tls {
            readTLS(tls)
            return
        }
        guard hasRoomToRead() else { return }
        while true {
            let n = Glibc.read(fd, input.end, input.spaceAtEnd)
            if n > 0 { hasMovedBytes = true }
            if n > 0 {
                input.didFill(n)
                owner?.streamReceived(self)
                input.releaseStorage()
                return
            }
            if n == 0 {
                input.releaseStorage()
                owner?.streamReachedEnd(self)
                return
            }
            let error = errno
            if error == EINTR { continue }
            if error == EAGAIN || error == EWOULDBLOCK {
                input.releaseStorage()
                return
            }
            fail(error)
            return
        }
    }

    /// Whether a read may go into the input buffer now. No: the owner has not consumed what it has (reading
    /// pauses; it resumes once it did), or the connection is lingering after its last answer (input is
    /// dropped instead).
    private func hasRoomToRead() -> Bool {
        if input.spaceAtEnd == 0 { input.compact() }
        guard input.spaceAtEnd > 0 else {
            pauseReading()
            return false
        }
        if discarding {
            discardInput()
            return false
        }
        return true
    }

    /// Reads what OpenSSL can decrypt into the free space, then hands it over once.
    private func readTLS(_ tls: TLSSession) {
        if tlsWriteWaitsForRead {
            tlsWriteWaitsForRead = false
            writable()
            guard !isClosed else { return }
        }
        // Woken by event_active for buffered input while paused: the resume comes back for it.
        guard !readingPaused else { return }
        guard hasRoomToRead() else { return }
        var received = 0
        var last = TLSSession.Step.wantRead
        while input.spaceAtEnd > 0 {
            let step = tls.read(into: input.end, count: input.spaceAtEnd)
            guard case .done(let n) = step else {
                last = step
                break
            }
            input.didFill(n)
            received += n
            // Nothing left inside OpenSSL: another SSL_read would only be a read(2) answered EAGAIN. The
            // read event is level-triggered, so bytes still in the socket wake this reader again.
            if !tls.hasBufferedInput { break }
        }
        if received > 0 { owner?.streamReceived(self) }
        guard !isClosed else { return }
        switch last {
        case .done, .wantRead:
            break
        case .wantWrite:
            tlsReadWaitsForWrite = true
            armWrite()
        case .end:
            input.releaseStorage()
            owner?.streamReachedEnd(self)
            return
        case .failed(let error, let reason):
            failureReason = reason
            fail(error)
            return
        }
        input.releaseStorage()
        if !readingPaused, tls.hasBufferedInput, let readEvent { event_active(readEvent, Int32(EV_READ), 0) }
    }
}
