import CLibevent
import Glibc

/// OpenSSL on one non-blocking socket, as `SocketStream` drives it: the handshake, reads and writes each
/// return at once with what happened or what the socket must become (readable, writable) first.
///
/// Every call starts with an empty error queue and errno 0, so that what `SSL_get_error` and the failure
/// texts read belongs to this call and not to an earlier failure on the loop's thread.
final class TLSSession {
    let ssl: OpaquePointer
    /// Keeps the `SSL_CTX` alive as long as the `SSL` made from it.
    let context: TransportTLSClientContext
    /// The name sent as SNI and verified: the key its sessions are kept under for resumption.
    let name: String
    /// A fatal error happened: OpenSSL forbids a close_notify (`SSL_shutdown`) afterwards.
    private var broken = false
    /// The handshake failed because our verification refused the peer's certificate (not an alert from
    /// the peer, not the socket): callers report it as a verification failure.
    private(set) var rejectedPeerCertificate = false

    enum Step {
        /// Bytes read or written (the handshake: done).
        case done(Int)
        case wantRead
        case wantWrite
        /// The peer closed (close_notify, or a close without it: HTTP's framing judges truncation).
        case end
        /// The connection cannot be used; `errno` for the stream's failure report, `reason` in words.
        case failed(errno: Int32, reason: String)
    }

    init(ssl: OpaquePointer, context: TransportTLSClientContext, name: String) {
        self.ssl = ssl
        self.context = context
        self.name = name
        SSL_set_info_callback(ssl, tlsInfoTrampoline)
        // Unretained: this object frees the `SSL` in deinit, so it outlives every callback on it.
        SSL_set_ex_data(ssl, tlsSessionSlot, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit {
        SSL_free(ssl)
    }

    /// Offers these protocols in ALPN (RFC 7301: each name preceded by its length), before the handshake.
    func offerProtocols(_ names: [String]) -> Bool {
        var wire: [UInt8] = []
        for name in names where !name.isEmpty && name.utf8.count < 256 {
            wire.append(UInt8(name.utf8.count))
            wire.append(contentsOf: name.utf8)
        }
        // OpenSSL's one inverted return: 0 is success here.
        return SSL_set_alpn_protos(ssl, wire, UInt32(wire.count)) == 0
    }

    /// The protocol the server selected in ALPN after the handshake; nil when it selected none.
    var selectedProtocol: String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    /// The socket of this connection attempt (a retry on the next address gets a new one).
    func attach(fd: Int32) -> Bool {
        ERR_clear_error()
        return SSL_set_fd(ssl, fd) == 1
    }

    func handshake() -> Step {
        ERR_clear_error()
        errno = 0   // an EOF is SSL_ERROR_SYSCALL with errno untouched: a stale value must not read as a cause
        let result = SSL_connect(ssl)
        if result == 1 {
            context.sessionCache.countHandshake(resumed: wasResumed)
            return .done(0)
        }
        let error = SSL_get_error(ssl, result)
        let savedErrno = errno
        switch error {
        case SSL_ERROR_WANT_READ: return .wantRead
        case SSL_ERROR_WANT_WRITE: return .wantWrite
        default:
            broken = true
            // The session offered (if any) may be what the server refused, and a server that failed us
            // once must not be offered it again: the next connection makes a full handshake.
            context.sessionCache.forget(name)
            return .failed(errno: savedErrno != 0 ? savedErrno : EPROTO, reason: handshakeFailure(error, savedErrno))
        }
    }

    func read(into buffer: UnsafeMutableRawPointer, count: Int) -> Step {
        clearErrorQueue()
        errno = 0
        let result = SSL_read(ssl, buffer, Int32(clamping: count))
        if result > 0 { return .done(Int(result)) }
        return classify(SSL_get_error(ssl, result), errno)
    }

    func write(_ bytes: UnsafeRawBufferPointer) -> Step {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return .done(0) }
        clearErrorQueue()
        errno = 0
        let result = SSL_write(ssl, base, Int32(clamping: bytes.count))
        if result > 0 { return .done(Int(result)) }
        return classify(SSL_get_error(ssl, result), errno)
    }

    /// `SSL_get_error` needs an empty error queue (docs/openssl.md). Looking costs a fraction of clearing,
    /// which rewrites every slot of the thread's queue, and on the read and write path the queue is
    /// nearly always empty already: clearing it twice per request was 5 % of a request over TLS.
    @inline(__always)
    private func clearErrorQueue() {
        if ERR_peek_error() != 0 { ERR_clear_error() }
    }

    /// The handshake resumed the session offered from the context's cache (no certificate exchange).
    var wasResumed: Bool { SSL_session_reused(ssl) == 1 }

    /// Decrypted bytes, or received bytes of a record, are waiting inside OpenSSL: the socket will not
    /// become readable for them, so a reader that stopped early must come back by itself.
    var hasBufferedInput: Bool { SSL_has_pending(ssl) == 1 }

    /// Sends close_notify if the connection is healthy; never waits for the peer's.
    func closeQuietly() {
        guard !broken, SSL_is_init_finished(ssl) == 1 else { return }
        _ = SSL_shutdown(ssl)
        ERR_clear_error()
    }

    private func classify(_ error: Int32, _ savedErrno: Int32) -> Step {
        switch error {
        case SSL_ERROR_WANT_READ: return .wantRead
        case SSL_ERROR_WANT_WRITE: return .wantWrite
        case SSL_ERROR_ZERO_RETURN: return .end
        case SSL_ERROR_SYSCALL where savedErrno == 0 && ERR_peek_error() == 0:
            broken = true
            return .end
        case SSL_ERROR_SYSCALL:
            broken = true
            return .failed(errno: savedErrno != 0 ? savedErrno : EPROTO,
                           reason: TLSErrorQueue.take() ?? String(cString: strerror(savedErrno)))
        default:
            broken = true
            let reason = takeAlert() ?? TLSErrorQueue.take() ?? "TLS error"
            return .failed(errno: EPROTO, reason: reason)
        }
    }

    /// Why the handshake failed, most specific first: our verification of the peer's certificate, an
    /// alert the peer sent (it refused our certificate, or the protocol), OpenSSL's reasons, the socket.
    private func handshakeFailure(_ error: Int32, _ savedErrno: Int32) -> String {
        let queued = TLSErrorQueue.take()
        let alert = takeAlert()
        if context.verifiesPeer {
            let result = SSL_get_verify_result(ssl)
            if result != X509_V_OK {
                rejectedPeerCertificate = true
                return "certificate verification failed: " + String(cString: X509_verify_cert_error_string(result))
            }
        }
        if let alert { return alert }
        if let queued { return queued }
        if error == SSL_ERROR_SYSCALL && savedErrno != 0 { return String(cString: strerror(savedErrno)) }
        return "the peer closed the connection during the handshake"
    }

    /// "TLS alert from the peer: certificate required", once.
    private func takeAlert() -> String? {
        guard let stored = SSL_get_ex_data(ssl, tlsAlertSlot) else { return nil }
        SSL_set_ex_data(ssl, tlsAlertSlot, nil)
        let alert = Int32(Int(bitPattern: stored) & 0xFF)
        return "TLS alert from the peer: " + String(cString: SSL_alert_desc_string_long(alert))
    }
}

/// Our slot in each `SSL`'s ex_data: the `TLSSession` that owns it (unretained), for the new-session callback.
private let tlsSessionSlot: Int32 = CRYPTO_get_ex_new_index(CRYPTO_EX_INDEX_SSL, 0, nil, nil, nil, nil)

/// OpenSSL's new-session callback (set on every `TransportTLSClientContext`): a session the server granted
/// (during a TLS 1.2 handshake, or as a TLS 1.3 ticket after it, read with the response) becomes the
/// context's session for this connection's name. Returning 1 takes over OpenSSL's reference.
let newSessionTrampoline: @convention(c) (OpaquePointer?, OpaquePointer?) -> Int32 = { ssl, session in
    guard let ssl, let session, let owner = SSL_get_ex_data(ssl, tlsSessionSlot) else { return 0 }
    let tls = Unmanaged<TLSSession>.fromOpaque(owner).takeUnretainedValue()
    tls.context.sessionCache.keep(session, for: tls.name)
    return 1
}

/// Our slot in each `SSL`'s ex_data: the last fatal alert the peer sent, as an integer (nothing to free).
private let tlsAlertSlot: Int32 = CRYPTO_get_ex_new_index(CRYPTO_EX_INDEX_SSL, 0, nil, nil, nil, nil)

/// OpenSSL's info callback: records fatal alerts from the peer, whose cause the error queue may not carry
/// (a TLS 1.3 server that refuses our certificate says so only in its alert).
private let tlsInfoTrampoline: @convention(c) (OpaquePointer?, Int32, Int32) -> Void = { ssl, event, value in
    // For alerts `value` is level << 8 | description; level 2 is fatal. 0x10000 marks "present" (an
    // alert's code can be 0).
    guard let ssl, event & Int32(SSL_CB_READ_ALERT) == Int32(SSL_CB_READ_ALERT), value >> 8 == 2 else { return }
    SSL_set_ex_data(ssl, tlsAlertSlot, UnsafeMutableRawPointer(bitPattern: Int(value & 0xFF) | 0x10000))
}
