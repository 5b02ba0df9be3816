/// `routes` and `identities`: several upstreams, each with the identity whose token it carries. The
/// top-level `upstream`, `tokens`, `refresh` and `inject` stay the default route and the default identity,
/// so a config without these keys means exactly what it meant before.
extension Config {
    /// One entry of `routes`.
    public struct Route: Sendable {
        /// Unique among the routes; a metric label, so bounded by the config (`RouteNames`).
        public var name: String
        /// The route's own listener: everything arriving there is this route's.
        public var listen: ListenAddress?
        /// How a request on the main listener is recognised as this route's (nil with `listen`).
        public var match: RouteMatch?
        public var upstream: Upstream
        /// The identity whose token this route carries; nil: the top-level one (`tokens`, `refresh`).
        public var identity: String?
        /// The route's own token header; nil: the top-level `inject`.
        public var inject: InjectSettings?
        /// `routes[].max_held_requests`: this route's share of `limits.max_held_requests`; nil: an equal part of
        /// what the explicit ones leave (`Config.heldRequestShare`).
        public var maxHeldRequests: Int?
    }

    /// `routes[].match`: the request's Host and/or the start of its path.
    public struct RouteMatch: Sendable, Hashable {
        /// Lower-cased; with no port it matches the Host field with or without one.
        public var host: String?
        /// Starts with `/`; the longest matching prefix wins.
        public var pathPrefix: String?
        /// Remove `pathPrefix` from the path before it goes upstream (keeping the leading `/`).
        public var stripPrefix = false
    }

    /// One entry of `identities`: everything the top level has for obtaining and keeping a token.
    public struct Identity: Sendable {
        public var name: String
        public var tokens: Tokens
        public var refresh: Refresh
        public var login: LoginSettings?
        /// `identities.<name>.dpop`: DPoP for this identity's tokens (the top level's `dpop` is the top level's only).
        public var dpop: DPoPSettings?
    }

    /// The `identity` label of the top-level identity's metrics when there are identities (so no identity may be called so).
    public static let defaultIdentityName = "default"
    /// The `route` label of the top-level route's request metrics when there are routes (no route may be called so).
    public static let defaultRouteName = "default"

    /// The identity `name` names; nil names the top-level identity, as does an unknown name (the loader
    /// refuses unknown names, so that cannot reach here from a file).
    public func identityTokens(_ name: String?) -> (tokens: Tokens, refresh: Refresh) {
        guard let name, let identity = identities.first(where: { $0.name == name }) else { return (tokens, refresh) }
        return (identity.tokens, identity.refresh)
    }

    /// What `run` says it proxies to: the top-level upstream, or the routes when there is none.
    var proxyingSummary: String { hasDefaultRoute ? "\(upstream.url)" : "\(routes.count) routes (no default: 404)" }
}
