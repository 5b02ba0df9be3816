/// What a request takes from the proxy when it arrives: the settings of the configuration it arrived
/// under, the long-lived services it reports to, and the proxy itself. Made once per configuration (at
/// start and at each reload) and shared by reference: an exchange retains this one object instead of
/// copying a dozen settings (strings among them) into itself on every request, and reaches the services
/// without going through the proxy's unowned reference (which costs a strong retain at each use).
final class ExchangeContext {
    /// Where requests go under this configuration.
    let route: UpstreamRoute
    /// The token header (`inject`).
    let injection: InjectSettings
    /// The token header as written into upstream heads, made once per token.
    let tokenField: TokenHeaderField
    let timeouts: Config.Timeouts
    let forwarding: Config.Forwarding
    let accessLog: Config.AccessLog
    /// `limits.max_body_bytes`: a larger request body is streamed, not kept for a replay.
    let maxBodyBytes: Int
    /// `refresh.trigger_statuses` of this route's identity, as configured and as a bit set (the membership
    /// test for every response).
    let triggerStatuses: Set<Int>
    let triggerStatusSet: StatusCodeSet
    /// `refresh.trigger_grpc_statuses` of this route's identity (asked only of gRPC answers without a message).
    let triggerGRPCStatuses: Set<Int>
    let coordinator: RefreshCoordinator
    /// The route's name (`default`: the top-level one) and how many of its requests may be held at once.
    let routeName: String
    let maxHeld: Int
    /// No route matched and there is no top-level `upstream`: tokenrelay answers 404, nothing goes upstream.
    let answersNotFound: Bool
    let metrics: RelayMetrics
    /// `tokenrelay_requests_total` of this context's route (labelled with it when there are routes).
    let requestCounters: RelayMetrics.RequestCounters
    /// DPoP (`dpop`), and this route's upstream as a DPoP server (its origin: the nonces it sends are its own).
    let dpop: DPoPProofs?
    let dpopOrigin: String
    /// The proxy, for the few things a request asks of its mutable state (its lists, whether it drains).
    /// Unowned: the proxy owns the contexts it makes; a context outlives it only in an exchange that is
    /// torn down with it, and such an exchange never runs again.
    unowned let proxy: ProxyServer
    /// The context a reload made after this one. A request in flight reads what applies to each step it
    /// takes now (the forwarding headers of a replay, the trigger statuses of a response, whether the
    /// access log is on) from the running configuration, as it always has: `current`, without a look at
    /// the proxy (an unowned reference costs a strong retain and release at each use).
    private(set) var replacement: ExchangeContext?

    /// The context of the running configuration.
    var current: ExchangeContext {
        var context = self
        while let newer = context.replacement { context = newer }
        return context
    }

    /// `injection`: the route's token header (the top-level `inject` unless the route has its own).
    /// `refresh`: the refresh settings of the route's identity (the top-level ones unless it names one): its
    /// trigger statuses are the ones its upstream's answers are judged by.
    init(config: Config, refresh: Config.Refresh, route: UpstreamRoute, injection: InjectSettings, proxy: ProxyServer,
         coordinator: RefreshCoordinator, metrics: RelayMetrics, requestCounters: RelayMetrics.RequestCounters,
         routeName: String = Config.defaultRouteName, maxHeld: Int? = nil, answersNotFound: Bool = false) {
        self.requestCounters = requestCounters
        self.routeName = routeName
        self.maxHeld = maxHeld ?? config.limits.maxHeldRequests
        self.answersNotFound = answersNotFound
        self.proxy = proxy
        self.route = route
        self.injection = injection
        // A route's own inject.format: the identity's header value (made with the top-level format) is laid
        // out again, once per token. A DPoP-bound token keeps its `DPoP` scheme whatever the format.
        tokenField = TokenHeaderField(header: injection.header,
                                      reformat: injection.format == config.inject.format ? nil
                                          : TokenHeaderField.Reformat(from: config.inject, to: injection))
        timeouts = config.timeouts
        forwarding = config.forwarding
        accessLog = config.accessLog
        maxBodyBytes = config.limits.maxBodyBytes
        triggerStatuses = refresh.triggerStatuses
        triggerStatusSet = StatusCodeSet(refresh.triggerStatuses)
        triggerGRPCStatuses = refresh.triggerGRPCStatuses
        self.coordinator = coordinator
        self.metrics = metrics
        dpop = coordinator.dpop
        dpopOrigin = "\(route.upstream.scheme)://\(route.upstream.authority)"
    }

    /// A reload: `newer` applies from now on.
    func replace(with newer: ExchangeContext) {
        replacement = newer
    }
}
