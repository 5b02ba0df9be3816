/// tls_client_auth (RFC 8705 §2.1): the certificate of the `refresh.tls` context, presented in the TLS
/// handshake, authenticates the client; the request itself names the client and carries no secret. The
/// certificate and its key are loaded with that context (at start and on reload, off the loop).
struct ClientCertificateCredential: ClientCredentialSource {
    let clientID: String
    var blocks: Bool { false }

    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields {
        ClientAuthenticationFields(fields: [("client_id", clientID)])
    }
}
