import FoundationEssentials

/// client_secret_basic and client_secret_post (RFC 6749 §2.3.1): the shared secret, in an
/// `Authorization: Basic` header or as form fields.
struct ClientSecretCredential: ClientCredentialSource {
    enum Style { case basic, post }

    let style: Style
    let clientID: String
    let secret: String

    var blocks: Bool { false }

    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields {
        switch style {
        case .post: ClientAuthenticationFields(fields: [("client_id", clientID), ("client_secret", secret)])
        case .basic: ClientAuthenticationFields(headers: [("Authorization", basicCredentials())])
        }
    }

    /// RFC 6749 §2.3.1: id and secret are form-encoded before being joined and base64-encoded.
    private func basicCredentials() -> String {
        let pair = "\(FormEncoding.escape(clientID)):\(FormEncoding.escape(secret))"
        return "Basic " + Data(pair.utf8).base64EncodedString()
    }
}

/// `client_auth: none` (a public client, RFC 6749 §2.1): the client names itself and nothing more; with
/// no client id configured (jwt_bearer, token_exchange) not even that.
struct ClientIDOnlyCredential: ClientCredentialSource {
    let clientID: String
    var blocks: Bool { false }

    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields {
        ClientAuthenticationFields(fields: clientID.isEmpty ? [] : [("client_id", clientID)])
    }
}
