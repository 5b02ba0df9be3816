/// One identity seen as a whole config: the top level with `tokens`, `refresh`, `login` and `dpop` replaced by the
/// identity's. Everything that checks or runs the top-level identity (the preflight, the token store, the
/// refresh coordinator, `token show|import`, `login`) works on a named identity through this, unchanged.
extension Config {
    public func scoped(to identity: Identity) -> Config {
        var scoped = self
        scoped.tokens = identity.tokens
        scoped.tokens.identity = identity.name
        scoped.hasDefaultIdentity = true
        scoped.refresh = identity.refresh
        scoped.login = identity.login
        scoped.dpop = identity.dpop
        scoped.routes = []
        scoped.identities = []
        return scoped
    }

    /// `--identity NAME` of the CLI: the named identity as a config, or the config itself for nil.
    public func scoped(toIdentityNamed name: String?) throws -> Config {
        guard let name else {
            // Without a top-level identity there is no default to fall back on: the file to work on must be named.
            guard hasDefaultIdentity else {
                throw ConfigError("--identity", "is required: this config has no top-level tokens (identities: \(identities.map(\.name).joined(separator: ", ")))")
            }
            return self
        }
        guard let identity = identities.first(where: { $0.name == name }) else {
            let known = identities.isEmpty ? "this config has no identities" : "identities: \(identities.map(\.name).joined(separator: ", "))"
            throw ConfigError("--identity", "unknown identity \"\(name)\" (\(known))")
        }
        return scoped(to: identity)
    }
}

extension ConfigError {
    /// The error of a check run on `scoped(to:)`, placed under the identity: `tokens.file` becomes
    /// `identities.hr.tokens.file`, so the operator edits the right block.
    func underIdentity(_ name: String) -> ConfigError {
        let scopedFields = ["tokens", "refresh", "login", "dpop"]
        guard scopedFields.contains(where: { field == $0 || field.hasPrefix("\($0).") }) else { return self }
        return ConfigError("identities.\(name).\(field)", reason)
    }
}
