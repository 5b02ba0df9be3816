import HTTPTransport

/// The TLS settings of one https target (the upstream, the token endpoint, a login endpoint), loaded once:
/// the transport's client context built from them, with the config path that errors and warnings name.
///
/// Everything that can fail because of a file (CA bundle, client certificate, key) fails here, when the
/// context is built in `Preflight`: `tokenrelay check` reports it under the config key at fault, and `run`
/// never starts half-able to connect.
final class TLSContext {
    /// Config path of the settings (`upstream.tls`), used in errors and log lines.
    let field: String
    let settings: TLSSettings
    let transport: TransportTLSClientContext

    init(settings: TLSSettings, field: String) throws {
        self.settings = settings
        self.field = field
        do {
            transport = try TransportTLSClientContext(caFile: settings.caFile, clientCertificateFile: settings.clientCert,
                                                      clientKeyFile: settings.clientKey, verifyPeer: !settings.insecureSkipVerify,
                                                      serverName: settings.serverName)
        } catch {
            throw ConfigError(Self.key(error.setting, in: field), error.description)
        }
    }

    private static func key(_ setting: TransportTLSClientContext.Setting?, in field: String) -> String {
        switch setting {
        case .caFile: "\(field).ca_file"
        case .clientCertificateFile: "\(field).client_cert"
        case .clientKeyFile: "\(field).client_key"
        case .serverName: "\(field).server_name"
        case nil: field
        }
    }
}

/// OpenSSL's process-wide state (see `HTTPTransport.OpenSSLProcessState`), for the command-line target.
public enum OpenSSLProcessState {
    public static func keepUntilExit() {
        HTTPTransport.OpenSSLProcessState.keepUntilExit()
    }
}
