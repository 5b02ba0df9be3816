/// The top-level identity (`tokens`, `refresh`): the default one, whose token a route naming no identity
/// carries. A config whose routes all name an identity of `identities` may leave it out: then nothing runs
/// for the top level (no token file, no refresh machine), and `Config.hasDefaultIdentity` is false.
extension ConfigLoader {
    /// `configured` false: the top level has no identity; `tokens` then names no store (nothing can open
    /// one by mistake) and `refresh` is the first identity's, standing in where a value is needed, as
    /// `routes[0].upstream` does for a missing `upstream`.
    static func readDefaultIdentity(_ root: JSONObjectReader, hasDefaultRoute: Bool)
        throws -> (tokens: Config.Tokens, refresh: Config.Refresh, configured: Bool) {
        guard root.optionalValue("tokens") == nil, let identities = try root.optionalObject("identities"),
              let first = identities.keys.first else {
            return (try readTokens(root.object("tokens")), try readRefresh(root.object("refresh")), true)
        }
        // A misspelt `tokens` is the likelier mistake, named first as for any key.
        let missing = root.missing("tokens")
        guard missing.field == "tokens" else { throw missing }
        if hasDefaultRoute {
            throw ConfigError("upstream", "is the top-level route, whose token is the top-level identity's: add tokens and refresh, "
                + "or move it into routes with an identity")
        }
        for field in ["refresh", "login", "dpop"] where root.optionalValue(field) != nil {
            throw ConfigError(field, "belongs to the top-level identity, which needs tokens too (or move it into identities)")
        }
        let standIn = try readRefresh(identities.object(first).object("refresh"))
        return (Config.Tokens(file: nil), standIn, false)
    }
}
