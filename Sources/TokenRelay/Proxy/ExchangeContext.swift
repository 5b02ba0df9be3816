/// What a request takes from the proxy when it arrives: the settings of the configuration it arrived
/// under and the long-lived services it reports to. Made once per configuration (at start and at each
/// reload) and shared by reference: an exchange retains this one object instead of copying a dozen
/// settings (strings among them) into itself on every request, and reaches the services without going
/// through its unowned proxy reference (which costs a strong retain at each use).
final class ExchangeContext {
    /// Where requests go under this configuration.
    let route: UpstreamRoute
    /// The token header (`inject`).
    let injection: InjectSettings
    let timeouts: Config.Timeouts
    let forwarding: Config.Forwarding
    let accessLog: Config.AccessLog
    /// `limits.max_body_bytes`: a larger request body is streamed, not kept for a replay.
    let maxBodyBytes: Int
    /// `refresh.trigger_statuses`, as configured and as a bit set (the membership test for every response).
    let triggerStatuses: Set<Int>
    let triggerStatusSet: StatusCodeSet
    let coordinator: RefreshCoordinator
    let metrics: RelayMetrics

    init(config: Config, route: UpstreamRoute, coordinator: RefreshCoordinator, metrics: RelayMetrics) {
        self.route = route
        injection = config.inject
        timeouts = config.timeouts
        forwarding = config.forwarding
        accessLog = config.accessLog
        maxBodyBytes = config.limits.maxBodyBytes
        triggerStatuses = config.refresh.triggerStatuses
        triggerStatusSet = StatusCodeSet(config.refresh.triggerStatuses)
        self.coordinator = coordinator
        self.metrics = metrics
    }
}
