/// private_key_jwt with `client_assertion_file`: a ready-made assertion (a projected service-account token)
/// read afresh for every token request, because whoever writes it (the kubelet) replaces it under us.
struct ClientAssertionFileCredential: ClientCredentialSource {
    let clientID: String
    let path: String

    var blocks: Bool { true }

    func authentication() throws(CredentialUnavailable) -> ClientAuthenticationFields {
        let assertion = try CredentialFile.jwt(at: path, field: "refresh.client_assertion_file")
        return ClientAuthenticationFields(fields: ClientAssertionFields.make(clientID: clientID, assertion: assertion))
    }
}
