import CLibevent
import Glibc

/// The most recent resumable TLS session per server name of one `TransportTLSClientContext`, offered on
/// the next connection to the same name so that a reconnect skips the full handshake (certificate chain,
/// signature, key exchange).
///
/// Keyed by the name SNI carries and the certificate was verified for: a session is never offered to
/// another host or server name (a resumed handshake does not verify the certificate again, so that is what
/// keeps verification sound). A handshake failure forgets the name's session, so a server that lost or
/// refuses it costs one full handshake, not a failure per connection. Locked: a context may be shared by
/// connections on more than one loop thread.
final class TLSSessionCache: @unchecked Sendable {   // state behind `lock`
    /// A context talks to one upstream or endpoint; the bound only stops a context used for many names
    /// (no `serverName`, changing hosts) from growing without limit.
    static let namesKept = 16

    /// Allocated, not a stored property: a pthread mutex must not move, and `&property` promises no address.
    private let lock = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var sessions: [String: OpaquePointer] = [:]
    private var full = 0
    private var resumed = 0

    init() {
        pthread_mutex_init(lock, nil)
    }

    deinit {
        for session in sessions.values { SSL_SESSION_free(session) }
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    /// Completed handshakes made with this cache's context, full and resumed.
    var handshakes: (full: Int, resumed: Int) { withLock { (full, resumed) } }

    func countHandshake(resumed wasResumed: Bool) {
        withLock { if wasResumed { resumed += 1 } else { full += 1 } }
    }

    /// Takes over the caller's reference to `session` (as OpenSSL's new-session callback hands it over).
    /// A session that cannot be resumed is released at once.
    func keep(_ session: OpaquePointer, for name: String) {
        guard SSL_SESSION_is_resumable(session) == 1 else {
            SSL_SESSION_free(session)
            return
        }
        let replaced: OpaquePointer? = withLock {
            if sessions[name] == nil && sessions.count >= Self.namesKept { sessions.removeAll(keepingCapacity: true) }
            return sessions.updateValue(session, forKey: name)
        }
        if let replaced { SSL_SESSION_free(replaced) }
    }

    /// Sets the name's session on `ssl` for the handshake to offer (OpenSSL takes its own reference, so the
    /// cache may drop it meanwhile). False when there is none.
    @discardableResult
    func offer(for name: String, to ssl: OpaquePointer) -> Bool {
        withLock {
            guard let session = sessions[name] else { return false }
            return SSL_set_session(ssl, session) == 1
        }
    }

    func forget(_ name: String) {
        if let dropped = withLock({ sessions.removeValue(forKey: name) }) { SSL_SESSION_free(dropped) }
    }

    private func withLock<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        return body()
    }
}
