extension TokenHTTPRequest {
    /// A form-encoded POST to `endpoint` asking for JSON, with the client authenticated by `client`
    /// (`refresh.client_auth`). The refresh grants and `tokenrelay login` (whose endpoints follow the same
    /// rules, RFC 8628 §3.1) share this one definition, so the client never authenticates one way when
    /// refreshing and another way when logging in, and never switches between attempts.
    static func oauthForm(to endpoint: HTTPEndpoint, fields: [(String, String)],
                          client: any ClientCredentialSource) throws(CredentialUnavailable) -> TokenHTTPRequest {
        let authentication = try client.authentication()
        let headers: [(name: String, value: String)] = [("Content-Type", "application/x-www-form-urlencoded"), ("Accept", "application/json")]
        return TokenHTTPRequest(method: "POST", target: endpoint.requestTarget, headers: headers + authentication.headers,
                                body: Array(FormEncoding.encode(fields + authentication.fields).utf8))
    }
}
