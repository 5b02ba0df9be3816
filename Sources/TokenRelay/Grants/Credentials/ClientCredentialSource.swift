/// What authenticates the client in one token request: form fields (`client_id`, `client_secret`,
/// `client_assertion`…) and headers (`Authorization: Basic`). One conforming type per kind of credential
/// (a secret, a private key, an assertion file, a certificate), chosen once from `refresh.client_auth`;
/// the grants only add what this returns to their form.
protocol ClientCredentialSource: Sendable {
    /// Whether producing the fields blocks — a file read or a signature. A token request built with such a
    /// source is built on a helper thread (`TokenEndpointClient`), so no proxied request waits behind it.
    var blocks: Bool { get }

    /// The fields for one request. Called once per request: an assertion is fresh (new `jti`, new `exp`)
    /// every time. A credential that cannot be produced now (an assertion file missing, empty or expired)
    /// throws with a one-line reason that names the file, never its content.
    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields
}

struct ClientAuthenticationFields {
    var fields: [(String, String)] = []
    var headers: [(name: String, value: String)] = []
}

/// A credential that cannot be produced for this request. Transient: the file may be replaced in time
/// for the next attempt; the session itself is fine.
struct CredentialUnavailable: Error, CustomStringConvertible {
    let reason: String
    var description: String { reason }
}

enum ClientCredentials {
    /// The source for `refresh.client_auth`, with the secret and keys loaded by `Preflight` (never here:
    /// this runs on the loop, at start and after a reload).
    static func make(_ settings: Config.Refresh, clientSecret: String?, keys: CredentialKeys) -> any ClientCredentialSource {
        make(method: settings.clientAuth, clientID: settings.clientID, clientSecret: clientSecret,
             assertion: settings.clientAssertion, keys: keys)
    }

    static func make(method: Config.Refresh.ClientAuth, clientID: String, clientSecret: String?,
                     assertion: ClientAssertionSource?, keys: CredentialKeys) -> any ClientCredentialSource {
        switch method {
        case .clientSecretBasic: ClientSecretCredential(style: .basic, clientID: clientID, secret: clientSecret ?? "")
        case .clientSecretPost: ClientSecretCredential(style: .post, clientID: clientID, secret: clientSecret ?? "")
        case .none: ClientIDOnlyCredential(clientID: clientID)
        case .tlsClientAuth: ClientCertificateCredential(clientID: clientID)
        case .privateKeyJWT:
            switch assertion {
            case .signed(let signing)?:
                if let signer = keys.clientAssertion {
                    PrivateKeyJWTCredential(clientID: clientID, signer: signer, audience: signing.audience)
                } else {
                    UnavailableCredential(reason: "\(signing.keyField): no key loaded")
                }
            case .file(let path)?: ClientAssertionFileCredential(clientID: clientID, path: path)
            case nil: UnavailableCredential(reason: "refresh.client_key_file: not configured")
            }
        }
    }
}

/// Only reachable through a programming error (settings and keys out of step): every request fails
/// transiently with the reason instead of going out unauthenticated.
struct UnavailableCredential: ClientCredentialSource {
    let reason: String
    var blocks: Bool { false }
    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields { throw CredentialUnavailable(reason: reason) }
}
