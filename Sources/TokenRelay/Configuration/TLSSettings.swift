/// How tokenrelay talks TLS to one target (`upstream.tls`, `refresh.tls`, `tokens.redis.tls`). Only
/// meaningful for an `https://` (or `rediss://`) URL; such a URL without a `tls` object gets these
/// defaults: verification against the system CA store, the URL's host checked and sent as SNI, no client
/// certificate.
public struct TLSSettings: Sendable, Equatable {
    /// PEM bundle that replaces the system CA store (a private CA must not be trusted for everything else).
    public var caFile: String?
    /// Overrides the name sent as SNI and checked against the certificate (the URL's host otherwise),
    /// for upstreams reached by an address their certificate does not name.
    public var serverName: String?
    /// PEM certificate chain and private key for mutual TLS; both or neither.
    public var clientCert: String?
    public var clientKey: String?
    /// Accept any certificate. For tests and emergencies only; logged as a warning at start.
    public var insecureSkipVerify = false

    public init() {}

    /// Reads the optional `tls` object of `parent` (the object holding the URL) for `endpoint`.
    static func read(from parent: JSONObjectReader, for endpoint: HTTPEndpoint) throws -> TLSSettings? {
        try read(from: parent, urlUsesTLS: endpoint.usesTLS, urlKind: "an https:// URL")
    }

    /// The same object for any URL: refused unless `urlUsesTLS` (naming `urlKind`, the URL it needs).
    static func read(from parent: JSONObjectReader, urlUsesTLS: Bool, urlKind: String) throws -> TLSSettings? {
        guard let object = try parent.optionalObject("tls") else { return nil }
        guard urlUsesTLS else {
            throw ConfigError(object.path, "is only allowed with \(urlKind)")
        }
        var settings = TLSSettings()
        settings.caFile = try object.optionalString("ca_file")
        settings.serverName = try object.optionalString("server_name")
        settings.clientCert = try object.optionalString("client_cert")
        settings.clientKey = try object.optionalString("client_key")
        settings.insecureSkipVerify = try object.optionalBool("insecure_skip_verify") ?? false
        switch (settings.clientCert, settings.clientKey) {
        case (_?, nil): throw ConfigError(object.fieldPath("client_key"), "is required when client_cert is set")
        case (nil, _?): throw ConfigError(object.fieldPath("client_cert"), "is required when client_key is set")
        default: break
        }
        try object.rejectUnknownKeys()
        return settings
    }
}
