import CLibevent
import Glibc

/// An outgoing stream's way to open: the non-blocking connect, the TLS handshake, and reporting either
/// outcome to the owner. Apart from `SocketStream.swift` because an accepted stream never takes this path.
extension SocketStream {
    /// Starts a non-blocking connect. Returns nil, or the errno of an immediate failure (the stream then
    /// stays unconnected). Completion or failure is reported to the owner.
    func connect(to address: SocketAddress) -> Int32? {
        guard !isClosed, phase == .unconnected else { return EALREADY }
        let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return errno }
        var one: Int32 = 1
        if address.family != AF_UNIX { setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size)) }
        if address.withSockaddr({ Glibc.connect(fd, $0, $1) }) != 0 && errno != EINPROGRESS {
            let error = errno
            Glibc.close(fd)
            return error
        }
        if let tls, !tls.attach(fd: fd) {
            Glibc.close(fd)
            return ENOMEM
        }
        self.fd = fd
        createEvents()
        phase = .connecting
        // Writability reports the end of the connect, successful or not.
        armWrite()
        return nil
    }

    /// The connect finished: read from now on, handshake if TLS, then write what waited.
    func finishConnect() {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 { error = errno }
        if error != 0 {
            connectFailed(errno: error, reason: String(cString: strerror(error)), duringHandshake: false)
            return
        }
        if let tls {
            // The handshake reads whatever the consumer wants; a pause applies once the stream is open.
            event_add(readEvent, nil)
            phase = .handshaking
            continueHandshake(tls)
            return
        }
        if !readingPaused { event_add(readEvent, nil) }
        becomeOpen()
    }

    func continueHandshake(_ tls: TLSSession) {
        switch tls.handshake() {
        case .done:
            if readingPaused { event_del(readEvent) }
            becomeOpen()
        case .wantRead:
            disarmWrite()
        case .wantWrite:
            armWrite()
        case .end:
            connectFailed(errno: ECONNRESET, reason: "the peer closed the connection during the handshake", duringHandshake: true)
        case .failed(let error, let reason):
            connectFailed(errno: error, reason: reason, duringHandshake: true)
        }
    }

    private func becomeOpen() {
        phase = .open
        owner?.streamConnected(self)
        guard !isClosed else { return }
        if pendingOutput > 0 {
            armWrite()
            writable()
        } else {
            disarmWrite()
        }
        // The server's first bytes may have come with the end of the handshake.
        if !isClosed, !readingPaused, tls?.hasBufferedInput == true { event_active(readEvent, Int32(EV_READ), 0) }
    }

    private func connectFailed(errno error: Int32, reason: String, duringHandshake: Bool) {
        if let readEvent { event_free(readEvent) }
        if let writeEvent { event_free(writeEvent) }
        readEvent = nil
        writeEvent = nil
        writeArmed = false
        Glibc.close(fd)
        fd = -1
        phase = .unconnected
        owner?.streamConnectFailed(self, errno: error, reason: reason, duringHandshake: duringHandshake)
    }
}
