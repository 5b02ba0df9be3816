import CEventShim
import CLibevent
import Glibc
import HTTPTransport

/// One OpenSSL `SSL_CTX` for one target (the upstream, or the token endpoint), built once per process,
/// and the per-connection `SSL` objects made from it.
///
/// Everything that can fail because of a file (CA bundle, client certificate, key) fails here, when the
/// context is built in `Preflight`: `tokenrelay check` reports it, and `run` never starts half-able to
/// connect. Per connection only SNI and the name to verify are set, which cannot fail for a valid config.
final class TLSContext {
    let ctx: OpaquePointer
    /// Config path of the settings (`upstream.tls`), used in errors and log lines.
    let field: String
    let settings: TLSSettings
    /// The name SNI carries and the certificate must match: `server_name`, else the URL's host.
    let verifiedName: String
    private let nameIsIPAddress: Bool
    /// The same settings for the transport engine's upstream connections (`data_plane: transport`).
    /// Set once the files above loaded (their checks name the fault best).
    private(set) var transport: TransportTLSClientContext?

    /// `forTransport`: also build the transport engine's context (the upstream under `data_plane: transport`).
    init(settings: TLSSettings, host: String, field: String, forTransport: Bool = false) throws {
        self.settings = settings
        self.field = field
        verifiedName = settings.serverName ?? host
        nameIsIPAddress = Self.isIPAddress(verifiedName)
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_client_method()) else {
            throw ConfigError(field, "cannot create a TLS context: \(OpenSSLErrors.drainReasons())")
        }
        self.ctx = ctx
        // Anything older than TLS 1.2 is broken or deprecated (RFC 8996); no setting can lower it.
        _ = tr_ssl_ctx_set_min_proto_version(ctx, TLS1_2_VERSION)
        // An encrypted key would make OpenSSL prompt on the terminal; a sidecar must fail instead.
        SSL_CTX_set_default_passwd_cb(ctx, refuseKeyPassphraseTrampoline)
        if settings.insecureSkipVerify {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nil)
        } else {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        }
        try loadTrustAnchors()
        try loadClientCertificate()
        guard forTransport else { return }
        do {
            transport = try TransportTLSClientContext(caFile: settings.caFile, clientCertificateFile: settings.clientCert,
                                                      clientKeyFile: settings.clientKey, verifyPeer: !settings.insecureSkipVerify,
                                                      serverName: settings.serverName)
        } catch {
            throw ConfigError(field, error.description)
        }
    }

    deinit {
        SSL_CTX_free(ctx)
    }

    private func loadTrustAnchors() throws {
        guard let caFile = settings.caFile else {
            guard SSL_CTX_set_default_verify_paths(ctx) == 1 else {
                throw ConfigError(field, "cannot load the system CA store: \(OpenSSLErrors.drainReasons())")
            }
            return
        }
        let caField = "\(field).ca_file"
        try Self.checkReadable(caFile, field: caField)
        guard SSL_CTX_load_verify_locations(ctx, caFile, nil) == 1 else {
            throw ConfigError(caField, "cannot load \(caFile): \(OpenSSLErrors.drainReasons())")
        }
    }

    private func loadClientCertificate() throws {
        guard let cert = settings.clientCert, let key = settings.clientKey else { return }
        let certField = "\(field).client_cert", keyField = "\(field).client_key"
        try Self.checkReadable(cert, field: certField)
        try Self.checkReadable(key, field: keyField)
        guard SSL_CTX_use_certificate_chain_file(ctx, cert) == 1 else {
            throw ConfigError(certField, "cannot load \(cert): \(OpenSSLErrors.drainReasons())")
        }
        guard SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1 else {
            throw ConfigError(keyField, "cannot load \(key): \(OpenSSLErrors.drainReasons())")
        }
        guard SSL_CTX_check_private_key(ctx) == 1 else {
            throw ConfigError(keyField, "does not match client_cert: \(OpenSSLErrors.drainReasons())")
        }
    }

    /// A fresh `SSL` for one connection: SNI (never for an IP address, RFC 6066 §3) and the name the
    /// certificate must carry (a DNS name via `SSL_set1_host`, an IP address as an iPAddress SAN).
    func makeSSL() -> OpaquePointer? {
        guard let ssl = SSL_new(ctx) else { return nil }
        var ok = true
        if !nameIsIPAddress {
            ok = tr_ssl_set_tlsext_host_name(ssl, verifiedName) == 1
        }
        if ok && !settings.insecureSkipVerify {
            if nameIsIPAddress {
                ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), verifiedName) == 1
            } else {
                SSL_set_hostflags(ssl, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
                ok = SSL_set1_host(ssl, verifiedName) == 1
            }
        }
        guard ok else {
            SSL_free(ssl)
            return nil
        }
        TLSAlerts.watch(ssl)
        return ssl
    }

    private static func isIPAddress(_ name: String) -> Bool {
        var storage = in6_addr()
        return inet_pton(AF_INET, name, &storage) == 1 || inet_pton(AF_INET6, name, &storage) == 1
    }

    /// OpenSSL's "system library" errors for a missing file are vaguer than errno; say it plainly.
    private static func checkReadable(_ path: String, field: String) throws {
        guard access(path, R_OK) == 0 else {
            throw ConfigError(field, "cannot read \(path): \(String(cString: strerror(errno)))")
        }
    }
}

/// OpenSSL's process-wide state.
public enum OpenSSLProcessState {
    /// Call before anything else uses OpenSSL. By default OpenSSL frees its global state in an exit
    /// handler; a SIGHUP reload still being prepared on a helper thread (building a `TLSContext` from a
    /// slow file) when the drain ends and the process exits would then run inside freed state and crash
    /// the exit. The process is ending anyway: the memory goes with it.
    public static func keepUntilExit() {
        _ = OPENSSL_init_crypto(UInt64(OPENSSL_INIT_NO_ATEXIT), nil)
    }
}

/// The thread's OpenSSL error queue, as text.
enum OpenSSLErrors {
    /// Empties the queue and returns its reason strings, oldest first ("no certificate or crl found").
    static func drainReasons() -> String {
        var reasons: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            reasons.append(ERR_reason_error_string(code).map { String(cString: $0) } ?? describe(code))
        }
        return reasons.isEmpty ? "unknown OpenSSL error" : reasons.joined(separator: ": ")
    }

    /// The full form, `error:0A000086:SSL routines::certificate verify failed`.
    static func describe(_ code: UInt) -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        let text = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return String(decoding: text, as: UTF8.self)
    }
}
