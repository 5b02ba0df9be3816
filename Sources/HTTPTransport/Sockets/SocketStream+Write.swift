import CLibevent
import Glibc

/// Writing: try at once, queue what the socket does not take, and the write event that is armed only while
/// bytes wait (also the connect's completion and the send-stall timeout). Apart from `SocketStream.swift`
/// (the state and the close) and `+Read` so that each direction reads alone.
extension SocketStream {
    /// Writes now as far as the socket takes it; keeps the rest and asks for writability only then.
    /// Before the stream is open everything waits in the queue.
    func write(_ bytes: UnsafeRawBufferPointer) {
        guard !isClosed, bytes.count > 0 else { return }
        var offset = 0
        if pendingOutput == 0 && phase == .open {
            guard let written = writeNow(bytes) else { return }
            offset = written
            if offset == bytes.count { return }
        }
        output.append(contentsOf: bytes[offset...])
        if phase == .open { armWrite() }
    }

    func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { write($0) }
    }

    /// Writes several pieces with one `writev` (a head and its body, a chunk's size line, data and CRLF),
    /// keeping what the socket does not take, in order.
    func write(parts: UnsafeRawBufferPointer...) {
        guard !isClosed else { return }
        var total = 0
        for part in parts { total += part.count }
        guard total > 0 else { return }
        if tls != nil {
            // OpenSSL makes a record of each write: a small head and body go out as one.
            if total <= 16 * 1024 {
                var joined: [UInt8] = []
                joined.reserveCapacity(total)
                for part in parts { joined.append(contentsOf: part) }
                write(joined)
            } else {
                for part in parts { write(part) }
            }
            return
        }
        var written = 0
        if pendingOutput == 0 && phase == .open {
            // At most four pieces (prefix, chunk size line, data, CRLF): the vector lives on the stack.
            var storage: (iovec, iovec, iovec, iovec) = (iovec(), iovec(), iovec(), iovec())
            var used = 0
            withUnsafeMutableBytes(of: &storage) { raw in
                let vectors = raw.bindMemory(to: iovec.self)
                for part in parts where part.count > 0 {
                    precondition(used < vectors.count, "write(parts:) takes at most four pieces")
                    vectors[used] = iovec(iov_base: UnsafeMutableRawPointer(mutating: part.baseAddress), iov_len: part.count)
                    used += 1
                }
            }
            while true {
                let n = withUnsafeBytes(of: &storage) { raw in writev(fd, raw.bindMemory(to: iovec.self).baseAddress, Int32(used)) }
                if n > 0 { hasMovedBytes = true }
                if n >= 0 {
                    written = n
                    break
                }
                let error = errno
                if error == EINTR { continue }
                if error == EAGAIN || error == EWOULDBLOCK { break }
                fail(error)
                return
            }
            if written == total { return }
        }
        // Queue the rest: skip what went out, keep the remainder of each piece.
        var skip = written
        for part in parts {
            if skip >= part.count {
                skip -= part.count
                continue
            }
            output.append(contentsOf: part[skip...])
            skip = 0
        }
        if phase == .open { armWrite() }
    }

    func writable() {
        guard !isClosed else { return }
        switch phase {
        case .unconnected:
            return
        case .connecting:
            finishConnect()
            return
        case .handshaking:
            if let tls { continueHandshake(tls) }
            return
        case .open:
            break
        }
        if let spliceSink, pendingOutput == 0 {
            spliceSink.sinkWritable()
            return
        }
        if tlsReadWaitsForWrite {
            tlsReadWaitsForWrite = false
            readable()
            guard !isClosed else { return }
            if pendingOutput == 0 {
                if !tlsReadWaitsForWrite { disarmWrite() }
                return
            }
        }
        while pendingOutput > 0 {
            let written = output.withUnsafeBytes { all in
                writeNow(UnsafeRawBufferPointer(rebasing: all[outputStart...]))
            }
            guard let written else { return }
            outputStart += written
            if tlsWriteWaitsForRead {
                // Writable is not what OpenSSL waits for: readable() comes back here.
                disarmWrite()
                return
            }
            if written == 0 {
                armWrite()
                return
            }
        }
        output.removeAll(keepingCapacity: output.capacity <= 256 * 1024)
        outputStart = 0
        if let spliceSink {
            spliceSink.sinkWritable()
            return
        }
        disarmWrite()
        if closeWhenFlushed {
            finishWithLinger()
            return
        }
        owner?.streamDrained(self)
    }

    /// `sendStallLimit` passed with output queued and none of it taken.
    func sendStalled() {
        guard !isClosed, phase == .open, pendingOutput > 0 || spliceSink?.holdsBytes == true else { return }
        fail(ETIMEDOUT)
    }

    /// Bytes written (possibly fewer than given; 0 when the socket is full), or nil after a failure.
    private func writeNow(_ bytes: UnsafeRawBufferPointer) -> Int? {
        if let tls { return writeTLS(tls, bytes) }
        var offset = 0
        while offset < bytes.count {
            let n = Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if n > 0 { hasMovedBytes = true }
            if n > 0 {
                offset += n
                continue
            }
            let error = errno
            if n < 0 && error == EINTR { continue }
            if n < 0 && (error == EAGAIN || error == EWOULDBLOCK) { break }
            fail(n < 0 ? error : EPIPE)
            return nil
        }
        return offset
    }

    /// OpenSSL requires a write that could not finish to be repeated with the same bytes (at least as
    /// many, from any address: ACCEPT_MOVING_WRITE_BUFFER). The unwritten rest always becomes the front
    /// of `output`, so the retry in `writable` starts with exactly those bytes.
    private func writeTLS(_ tls: TLSSession, _ bytes: UnsafeRawBufferPointer) -> Int? {
        var offset = 0
        while offset < bytes.count {
            switch tls.write(UnsafeRawBufferPointer(rebasing: bytes[offset...])) {
            case .done(let n):
                offset += n
            case .wantWrite:
                return offset
            case .wantRead:
                tlsWriteWaitsForRead = true
                return offset
            case .end:
                fail(EPIPE)
                return nil
            case .failed(let error, let reason):
                failureReason = reason
                fail(error)
                return nil
            }
        }
        return offset
    }

    func armWrite() {
        guard !writeArmed, !isClosed, !tlsWriteWaitsForRead, readEvent != nil else { return }
        if writeEvent == nil {
            let context = Unmanaged.passUnretained(self).toOpaque()
            writeEvent = event_new(loopBase, fd, Int16(EV_WRITE | EV_PERSIST), socketWriteTrampoline, context)
        }
        guard let writeEvent else { return }
        writeArmed = true
        if sendStallLimit > 0 && phase == .open {
            var tv = clampedTimeval(sendStallLimit)
            event_add(writeEvent, &tv)
        } else {
            event_add(writeEvent, nil)
        }
    }

    func disarmWrite() {
        guard writeArmed, let writeEvent else { return }
        writeArmed = false
        event_del(writeEvent)
    }
}
