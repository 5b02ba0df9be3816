/// The query of a logged path with the values of credential-like parameters replaced by `[redacted]`.
/// `log.access_query` is for seeing which resource a client asked for; a legacy client that puts its own
/// credentials in the URL (`?access_token=…`, a pre-signed `X-Amz-Signature`, `?api_key=…`) must not get
/// them written to the log by it. A parameter counts as a credential when its name (any case, `-` or `_`)
/// is or contains one of `credentialNameParts`; names and other values are kept byte for byte.
enum QueryRedaction {
    static let credentialNameParts = ["token", "secret", "password", "passwd", "key", "signature", "sig",
                                      "auth", "code", "session", "credential", "assertion"]

    static func redact(_ path: String) -> String {
        guard let question = path.firstIndex(of: "?") else { return path }
        let query = path[path.index(after: question)...]
        let parameters = query.split(separator: "&", omittingEmptySubsequences: false).map { parameter -> String in
            guard let equals = parameter.firstIndex(of: "=") else { return String(parameter) }
            let name = parameter[..<equals]
            return isCredentialName(name) ? "\(name)=[redacted]" : String(parameter)
        }
        return String(path[...question]) + parameters.joined(separator: "&")
    }

    static func isCredentialName(_ name: Substring) -> Bool {
        let folded = name.lowercased()
        return credentialNameParts.contains { folded.contains($0) }
    }
}
