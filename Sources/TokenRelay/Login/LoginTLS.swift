/// TLS for the login endpoints. The device authorization endpoint normally lives on the token
/// endpoint's server, and then `refresh.tls` (private CA, client certificate, server name) is exactly
/// right for it. For another server those settings would be a guess — a `server_name` or client
/// certificate meant for one host sent to another — so it gets the defaults: the system CA store.
enum LoginTLS {
    static func context(for endpoint: HTTPEndpoint, field: String, config: Config) throws -> TLSContext? {
        let tokenURL = config.refresh.tokenURL
        if tokenURL.usesTLS && tokenURL.host.lowercased() == endpoint.host.lowercased() && tokenURL.port == endpoint.port {
            return try Preflight.tlsContext(for: endpoint, settings: config.refresh.tls, field: "refresh.tls")
        }
        return try Preflight.tlsContext(for: endpoint, settings: nil, field: field)
    }
}
