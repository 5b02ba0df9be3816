/// The optional `login` object: where `tokenrelay login` runs the OAuth 2.0 Device Authorization Grant
/// (RFC 8628). Everything but the device authorization endpoint defaults to the `refresh` settings, so a
/// typical config adds one URL; the client authentication and its secret are always `refresh`'s, because
/// one client that authenticates two different ways is a misconfiguration waiting to happen.
public struct LoginSettings: Sendable {
    public var deviceAuthorizationURL: HTTPEndpoint
    /// Where the device code is exchanged for tokens (default `refresh.token_url`).
    public var tokenURL: HTTPEndpoint
    public var clientID: String
    /// Sent with the device authorization request (default `refresh.scope`).
    public var scope: String?

    /// Reads `login` from the root object, given the already validated `refresh` settings.
    static func read(from root: JSONObjectReader, refresh: Config.Refresh) throws -> LoginSettings? {
        guard let object = try root.optionalObject("login") else { return nil }
        object.declareKeys(["device_authorization_url", "token_url", "client_id", "scope"])
        // The device grant ends with a refresh token for tokenrelay to renew; the other grants either
        // need no login (client_credentials) or talk to an endpoint that is not an OAuth token endpoint.
        guard refresh.grant == .refreshToken else {
            throw ConfigError(object.path, "is only used with refresh.grant refresh_token (the device login yields a refresh token)")
        }
        let deviceURL = try HTTPEndpoint.parse(object.string("device_authorization_url"), field: object.fieldPath("device_authorization_url"))
        let tokenURL = try object.optionalString("token_url").map { try HTTPEndpoint.parse($0, field: object.fieldPath("token_url")) }
        let settings = LoginSettings(deviceAuthorizationURL: deviceURL, tokenURL: tokenURL ?? refresh.tokenURL,
                                     clientID: try object.optionalString("client_id") ?? refresh.clientID,
                                     scope: try object.optionalString("scope") ?? refresh.scope)
        try object.rejectUnknownKeys()
        return settings
    }
}
