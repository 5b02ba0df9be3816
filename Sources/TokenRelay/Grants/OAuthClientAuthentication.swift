import FoundationEssentials

/// RFC 6749 §2.3 client authentication, exactly as `refresh.client_auth` says: the refresh grants and
/// `tokenrelay login` (whose endpoints follow the same rules, RFC 8628 §3.1) share this one definition,
/// so the client never authenticates one way when refreshing and another way when logging in.
struct OAuthClientAuthentication {
    let method: Config.Refresh.ClientAuth
    let clientID: String
    let clientSecret: String?

    /// Adds the client's credentials to a form request: `client_id` (and the secret, for
    /// client_secret_post) as fields, or an `Authorization: Basic` header.
    func apply(fields: inout [(String, String)], headers: inout [(name: String, value: String)]) {
        switch method {
        case .clientSecretPost:
            fields.append(("client_id", clientID))
            fields.append(("client_secret", clientSecret ?? ""))
        case .none:
            fields.append(("client_id", clientID))
        case .clientSecretBasic:
            headers.append(("Authorization", basicCredentials()))
        }
    }

    /// RFC 6749 §2.3.1: id and secret are form-encoded before being joined and base64-encoded.
    private func basicCredentials() -> String {
        let pair = "\(FormEncoding.escape(clientID)):\(FormEncoding.escape(clientSecret ?? ""))"
        return "Basic " + Data(pair.utf8).base64EncodedString()
    }
}

extension TokenHTTPRequest {
    /// A form-encoded POST to `endpoint` asking for JSON, with the client authenticated as configured.
    static func oauthForm(to endpoint: HTTPEndpoint, fields: [(String, String)], client: OAuthClientAuthentication) -> TokenHTTPRequest {
        var fields = fields
        var headers: [(name: String, value: String)] = [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")]
        client.apply(fields: &fields, headers: &headers)
        return TokenHTTPRequest(method: "POST", target: endpoint.requestTarget, headers: headers,
                                body: Array(FormEncoding.encode(fields).utf8))
    }
}
