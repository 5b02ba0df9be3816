import CLibevent
import CTransportSocket
import Glibc

/// How upstream connections talk TLS: one OpenSSL client context, built once from files and flags, shared
/// by every connection made with it (OpenSSL allows that once the context is no longer changed).
///
/// Everything that can fail because of a file (CA bundle, client certificate, key) fails here, with one
/// line naming the file and the cause; per connection only the name to send and verify is set. TLS 1.2
/// is the minimum, and an encrypted key is refused instead of prompting on the terminal.
public final class TransportTLSClientContext: @unchecked Sendable {   // immutable after init but the locked session cache
    public struct ConfigurationError: Error, CustomStringConvertible {
        public let description: String
        /// The setting at fault, so a caller can name its own configuration key; nil: none in particular.
        public let setting: Setting?

        init(description: String, setting: Setting? = nil) {
            self.description = description
            self.setting = setting
        }
    }

    public enum Setting: Sendable {
        case caFile, clientCertificateFile, clientKeyFile, serverName
    }

    let context: OpaquePointer
    /// Checked against the certificate: false accepts any certificate (tests and emergencies only).
    public let verifiesPeer: Bool
    /// Sent as SNI and checked against the certificate instead of the host connected to.
    public let serverName: String?
    /// The last session per name, for resumption on the next connection.
    let sessionCache = TLSSessionCache()

    /// Completed handshakes made with this context so far: full ones and resumed ones (for tests and
    /// benchmarks; a reconnect to the same name is normally resumed).
    public var handshakeCounts: (full: Int, resumed: Int) { sessionCache.handshakes }

    /// - Parameters:
    ///   - caFile: PEM bundle that replaces the system's CA store; nil uses the system's.
    ///   - clientCertificateFile, clientKeyFile: PEM chain and key for mutual TLS; both or neither.
    ///   - verifyPeer: false accepts any certificate.
    ///   - serverName: the name for SNI and verification when it differs from the host connected to.
    public init(caFile: String? = nil, clientCertificateFile: String? = nil, clientKeyFile: String? = nil,
                verifyPeer: Bool = true, serverName: String? = nil) throws(ConfigurationError) {
        if let serverName, serverName.isEmpty || serverName.utf8.contains(0) || serverName.utf8.count > 253 {
            throw ConfigurationError(description: "server name \"\(serverName)\" is not a host name", setting: .serverName)
        }
        switch (clientCertificateFile, clientKeyFile) {
        case (_?, nil): throw ConfigurationError(description: "a client certificate needs its key", setting: .clientKeyFile)
        case (nil, _?): throw ConfigurationError(description: "a client key needs its certificate", setting: .clientCertificateFile)
        default: break
        }
        ERR_clear_error()
        guard let context = SSL_CTX_new(TLS_client_method()) else {
            throw ConfigurationError(description: "cannot create a TLS context: \(TLSErrorQueue.drain())")
        }
        // Freed here on failure: the context is this object's only once it is complete.
        do {
            try Self.configure(context, caFile: caFile, clientCertificateFile: clientCertificateFile,
                               clientKeyFile: clientKeyFile, verifyPeer: verifyPeer)
        } catch {
            SSL_CTX_free(context)
            ERR_clear_error()
            throw error
        }
        self.context = context
        self.verifiesPeer = verifyPeer
        self.serverName = serverName
    }

    private static func configure(_ context: OpaquePointer, caFile: String?, clientCertificateFile: String?,
                                  clientKeyFile: String?, verifyPeer: Bool) throws(ConfigurationError) {
        guard transport_tls_configure_client_context(context) == 1 else {
            throw ConfigurationError(description: "cannot configure the TLS context: \(TLSErrorQueue.drain())")
        }
        SSL_CTX_set_default_passwd_cb(context, refusePassphraseTrampoline)
        SSL_CTX_sess_set_new_cb(context, newSessionTrampoline)
        SSL_CTX_set_verify(context, verifyPeer ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nil)
        if let caFile {
            try checkReadable(caFile, what: "CA file", setting: .caFile)
            guard SSL_CTX_load_verify_locations(context, caFile, nil) == 1 else {
                throw ConfigurationError(description: "cannot load CA file \(caFile): \(TLSErrorQueue.drain())", setting: .caFile)
            }
        } else if SSL_CTX_set_default_verify_paths(context) != 1 {
            throw ConfigurationError(description: "cannot load the system CA store: \(TLSErrorQueue.drain())")
        }
        if let certificate = clientCertificateFile, let key = clientKeyFile {
            try checkReadable(certificate, what: "client certificate", setting: .clientCertificateFile)
            try checkReadable(key, what: "client key", setting: .clientKeyFile)
            guard SSL_CTX_use_certificate_chain_file(context, certificate) == 1 else {
                throw ConfigurationError(description: "cannot load client certificate \(certificate): \(TLSErrorQueue.drain())",
                                         setting: .clientCertificateFile)
            }
            guard SSL_CTX_use_PrivateKey_file(context, key, SSL_FILETYPE_PEM) == 1 else {
                throw ConfigurationError(description: "cannot load client key \(key): \(TLSErrorQueue.drain())", setting: .clientKeyFile)
            }
            guard SSL_CTX_check_private_key(context) == 1 else {
                throw ConfigurationError(description: "client key \(key) does not match the client certificate: \(TLSErrorQueue.drain())",
                                         setting: .clientKeyFile)
            }
        }
    }

    deinit {
        SSL_CTX_free(context)
    }

    /// A session for one connection to `host`: SNI (never for an IP address) and the name the certificate
    /// must carry (a DNS name, or an IP address as an iPAddress entry). nil if OpenSSL refuses the name.
    func makeSession(host: String) -> TLSSession? {
        var name = serverName ?? host
        if name.hasPrefix("[") && name.hasSuffix("]") { name = String(name.dropFirst().dropLast()) }
        guard let ssl = SSL_new(context) else { return nil }
        let isAddress = Self.isIPAddress(name)
        var ok = isAddress || transport_tls_set_server_name(ssl, name) == 1
        if ok && verifiesPeer {
            if isAddress {
                ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1
            } else {
                SSL_set_hostflags(ssl, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
                ok = SSL_set1_host(ssl, name) == 1
            }
        }
        guard ok else {
            SSL_free(ssl)
            ERR_clear_error()
            return nil
        }
        sessionCache.offer(for: name, to: ssl)
        ERR_clear_error()
        return TLSSession(ssl: ssl, context: self, name: name)
    }

    private static func isIPAddress(_ name: String) -> Bool {
        var storage = in6_addr()
        return inet_pton(AF_INET, name, &storage) == 1 || inet_pton(AF_INET6, name, &storage) == 1
    }

    /// OpenSSL's "system lib" error for a missing file says less than errno; say it plainly.
    private static func checkReadable(_ path: String, what: String, setting: Setting) throws(ConfigurationError) {
        guard access(path, R_OK) == 0 else {
            throw ConfigurationError(description: "cannot read \(what) \(path): \(String(cString: strerror(errno)))", setting: setting)
        }
    }
}

/// The thread's OpenSSL error queue, as text.
enum TLSErrorQueue {
    /// Empties the queue; its reasons, oldest first ("certificate verify failed"), or nil if it was empty.
    static func take() -> String? {
        var reasons: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            if let reason = ERR_reason_error_string(code) {
                reasons.append(String(cString: reason))
            } else {
                var buffer = [CChar](repeating: 0, count: 256)
                ERR_error_string_n(code, &buffer, buffer.count)
                reasons.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
            }
        }
        return reasons.isEmpty ? nil : reasons.joined(separator: ": ")
    }

    static func drain() -> String { take() ?? "unknown OpenSSL error" }
}

/// An encrypted key would make OpenSSL prompt on the terminal; a sidecar must fail instead (the key
/// load then reports a bad decrypt, which the caller names with the file).
private let refusePassphraseTrampoline: @convention(c) (UnsafeMutablePointer<CChar>?, Int32, Int32, UnsafeMutableRawPointer?) -> Int32 = { _, _, _, _ in
    0
}

/// OpenSSL's process-wide state.
public enum OpenSSLProcessState {
    /// Call before anything else uses OpenSSL. By default OpenSSL frees its global state in an exit
    /// handler; a SIGHUP reload still being prepared on a helper thread (building a TLS context from a
    /// slow file) when the process exits would then run inside freed state and crash the exit. The
    /// process is ending anyway: the memory goes with it.
    public static func keepUntilExit() {
        _ = OPENSSL_init_crypto(UInt64(OPENSSL_INIT_NO_ATEXIT), nil)
    }
}
