import CLibevent

/// Why a TLS connection failed, in words an operator can act on.
struct TLSFailure: Equatable {
    /// "certificate verification failed: hostname mismatch (error:0A000086:SSL routines::certificate verify failed)"
    let reason: String
    /// Our side refused the peer's certificate, so nothing of the request can have reached the peer.
    let certificateRejected: Bool
}

/// Reads the real cause of a failed request from its connection's TLS state.
///
/// evhttp reports every bufferevent error as a plain EOF (docs/evhttp.md, tls-errors). The cause survives in two
/// places that evhttp's connection reset leaves alone: the verification result of the connection's
/// `SSL`, and the few OpenSSL errors libevent keeps per bufferevent. Both are read, and the latter
/// drained, so that a later failure on the same connection does not repeat a stale cause.
enum TLSDiagnostics {
    /// nil for a plain connection, or a TLS connection that failed for a non-TLS reason.
    static func failure(on connection: OpaquePointer) -> TLSFailure? {
        guard let bev = evhttp_connection_get_bufferevent(connection),
              let ssl = bufferevent_openssl_get_ssl(bev) else { return nil }
        var errors: [String] = []
        while case let code = bufferevent_get_openssl_error(bev), code != 0 {
            // libevent also queues SSL_get_error() values (SSL_ERROR_SSL, SSL_ERROR_SYSCALL), which are not
            // OpenSSL error codes (library 0) and say nothing beyond "it failed".
            guard ERR_GET_LIB(code) != 0 else { continue }
            errors.insert(OpenSSLErrors.describe(code), at: 0)  // libevent hands them out newest first
        }
        var verification: String?
        if SSL_get_verify_mode(ssl) & SSL_VERIFY_PEER != 0 {
            let result = SSL_get_verify_result(ssl)
            if result != X509_V_OK {
                verification = "certificate verification failed: " + String(cString: X509_verify_cert_error_string(result))
            }
        }
        // Taken either way, so that a later failure on this connection does not repeat it.
        if let alert = TLSAlerts.takeFatalAlert(ssl), errors.isEmpty { errors.append(alert) }
        switch (verification, errors.isEmpty) {
        case (nil, true):
            return nil
        case (let verification?, true):
            return TLSFailure(reason: verification, certificateRejected: true)
        case (let verification?, false):
            return TLSFailure(reason: "\(verification) (\(errors.joined(separator: "; ")))", certificateRejected: true)
        case (nil, false):
            return TLSFailure(reason: errors.joined(separator: "; "), certificateRejected: false)
        }
    }
}
