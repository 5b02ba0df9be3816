import HTTPTransport
import Logging

/// The proxied listener: accepts client requests, owns the upstream pool and the list of requests
/// held for a refresh, and keeps the counts that graceful shutdown waits on.
final class ProxyServer {
    // State the parts in ProxyServer+Actions/+Accounting.swift read and set is internal, not private (a
    // `private` member is visible only in this file); nothing outside the proxy sets it.
    let loop: EventLoop
    /// The running configuration; a reload swaps it (`apply`).
    private(set) var config: Config
    /// The top-level identity's; nil without one (every route names an identity).
    let coordinator: RefreshCoordinator?
    /// The coordinators of `identities` by name (routes naming one carry its token); a reload changes them (`use`).
    private var identityCoordinators: [String: RefreshCoordinator]
    /// Every identity's coordinator, the top-level one (if any) first.
    var coordinators: [RefreshCoordinator]
    /// Coordinators of identities a reload removed: a drain still waits for their exchange with the token endpoint.
    var retiredCoordinators: [RefreshCoordinator] = []
    /// What new requests take at arrival (their route among it); exchanges keep the one they arrived under.
    private(set) var context: ExchangeContext!
    /// Where new requests go.
    var route: UpstreamRoute { context.route }
    /// Routes a reload replaced, kept until their last connection is back.
    private var retiredRoutes: [UpstreamRoute] = []
    /// `limits.max_upstream_connections` for the whole process: every route's pools (HTTP/1.1 and HTTP/2,
    /// retired ones until their connections are back) draw from it. A reload changes its limit.
    let upstreamBudget: UpstreamConnectionBudget
    /// The contexts of `config.routes`, in route order, their names (to hand an exchange in flight to its
    /// route's next context at a reload), and the lookup for the main listener.
    private(set) var routeContexts: [ExchangeContext] = []
    private var routeNames: [String] = []
    private var routeTable = RouteTable(routes: [], hasDefaultRoute: true)
    /// Whether `routeTable` has a route: a plain flag, so that the look-up a config without routes makes on
    /// every request reads one byte instead of copying the table out of the proxy (a retain and a release).
    private var hasRoutes = false
    /// The contexts of routes with their own listener, by route name (requests there skip the lookup).
    private var listenerContexts: [String: ExchangeContext] = [:]
    let metrics: RelayMetrics
    let logger: Logger
    /// The proxied port (client connections, heads, bodies) on HTTPTransport.
    private(set) var frontEnd: TransportFrontEnd!
    /// Requests waiting for a refresh, per identity, bounded per route and in all.
    var held = HeldRequests()
    private var active = ActiveExchanges()
    private(set) var isDraining = false
    /// Tunnel slots (`limits.max_tunnels`) taken: by an upgrade handshake from its arrival, then by its
    /// tunnel until it closes. Taken at arrival, not at the 101, so that handshakes racing each other can
    /// never open more tunnels than the limit (and the descriptor budget) allows.
    var tunnelSlotsTaken = 0
    /// Called when draining and the last exchange has finished.
    var onDrained: (() -> Void)?

    init(loop: EventLoop, config: Config, upstreamTLS: TLSContext?, routeTLS: [TLSContext?] = [], coordinator: RefreshCoordinator?,
         identities: [NamedIdentity] = [], metrics: RelayMetrics, logger: Logger) throws {
        self.loop = loop
        self.config = config
        self.coordinator = coordinator
        identityCoordinators = Dictionary(identities.map { ($0.name, $0.coordinator) }, uniquingKeysWith: { first, _ in first })
        coordinators = Array(coordinator.map { [$0] } ?? []) + identities.map(\.coordinator)
        self.metrics = metrics
        self.logger = logger
        upstreamBudget = UpstreamConnectionBudget(limit: config.limits.maxUpstreamConnections)
        frontEnd = try TransportFrontEnd(proxy: self, config: config)
        context = makeContext(config, upstream: config.upstream, injection: config.inject, upstreamTLS: upstreamTLS)
        makeRouteContexts(config, routeTLS: routeTLS)
        coordinators.forEach(listen(to:))
    }

    private func listen(to identity: RefreshCoordinator) {
        identity.onOutcome = { [unowned self, unowned identity] outcome in self.refreshFinished(outcome, of: identity) }
    }

    /// A reload's identities, before its routes are applied (`apply`). A removed identity's held requests
    /// are answered at once (503: they cannot get a token from it any more) and its machine stops refreshing;
    /// its requests in flight end with the answers they get.
    func use(_ identities: [NamedIdentity]) {
        let kept = Set(identities.map { ObjectIdentifier($0.coordinator) })
        for removed in coordinators where removed !== coordinator && !kept.contains(ObjectIdentifier(removed)) {
            // Still heard: a request that joins its refresh in flight after this is released by that refresh.
            removed.stopRefreshing()
            refreshFinished(.unavailable(reason: "its identity was removed by a config reload"), of: removed)
            retiredCoordinators.append(removed)
        }
        identityCoordinators = Dictionary(identities.map { ($0.name, $0.coordinator) }, uniquingKeysWith: { first, _ in first })
        coordinators = Array(coordinator.map { [$0] } ?? []) + identities.map(\.coordinator)
        identities.map(\.coordinator).forEach(listen(to:))
    }

    /// The coordinator of `name`; nil names the top-level identity. The config checks (at start and on
    /// reload, with identities applied before routes) make a missing one impossible; a route must never
    /// fall back to another identity's token.
    /// Without a top-level identity only the default context asks for nil, and it answers every request 404
    /// itself (a config without one has no top-level `upstream`): the first route's identity stands in for
    /// it there, as the first route's upstream does for the missing `upstream`, and is never asked.
    private func identityCoordinator(_ name: String?, _ config: Config) -> RefreshCoordinator {
        guard let name = name ?? (coordinator == nil ? config.routes.first?.identity : nil) else {
            guard let coordinator else { preconditionFailure("a config without a top-level identity has a route naming none") }
            return coordinator
        }
        guard let found = identityCoordinators[name] else { preconditionFailure("route names identity \(name), which is not running") }
        return found
    }

    /// `routeName`: nil for the top-level route.
    private func makeContext(_ config: Config, upstream: Config.Upstream, injection: InjectSettings, upstreamTLS: TLSContext?,
                             identity: String? = nil, routeName: String? = nil, maxHeld: Int? = nil,
                             listener: (host: String, port: Int)? = nil) -> ExchangeContext {
        // A route's identity has its own refresh block, trigger statuses included (the checks make a missing one impossible).
        let refresh = identity.flatMap { name in config.identities.first { $0.name == name }?.refresh } ?? config.refresh
        return ExchangeContext(config: config, refresh: refresh, route: makeRoute(upstream, config, upstreamTLS: upstreamTLS, listener: listener,
                                                                                                   reachable: routeName != nil || config.hasDefaultRoute),
                               injection: injection, proxy: self, coordinator: identityCoordinator(identity, config), metrics: metrics,
                               requestCounters: requestCounters(config, routeName: routeName),
                               routeName: routeName ?? Config.defaultRouteName, maxHeld: maxHeld ?? config.heldRequestShare(route: nil),
                               answersNotFound: routeName == nil && !config.hasDefaultRoute)
    }

    /// Request counters per route name, kept across reloads (a route's series goes on counting).
    private var routeRequestCounters: [String: RelayMetrics.RequestCounters] = [:]

    /// The `route` label only with routes configured: without, the metrics are what they always were.
    private func requestCounters(_ config: Config, routeName: String?) -> RelayMetrics.RequestCounters {
        guard !config.routes.isEmpty else { return metrics.requests }
        let name = routeName ?? Config.defaultRouteName
        if let counters = routeRequestCounters[name] { return counters }
        let counters = metrics.requestCounters(route: name)
        routeRequestCounters[name] = counters
        return counters
    }

    private func makeRouteContexts(_ config: Config, routeTLS: [TLSContext?]) {
        routeTable = RouteTable(routes: config.routes, hasDefaultRoute: config.hasDefaultRoute)
        hasRoutes = !routeTable.isEmpty
        routeNames = config.routes.map(\.name)
        routeContexts = config.routes.indices.map { index in
            let route = config.routes[index]
            // A route with its own listener: an absolute-form target there names that listener.
            let listener = route.listen.flatMap { listen in frontEnd.port(ofRoute: route.name).map { (listen.host, Int($0)) } }
            return makeContext(config, upstream: route.upstream, injection: route.inject ?? config.inject,
                               upstreamTLS: index < routeTLS.count ? routeTLS[index] : nil, identity: route.identity, routeName: route.name,
                               maxHeld: config.heldRequestShare(route: index), listener: listener)
        }
        listenerContexts = [:]
        for (index, route) in config.routes.enumerated() where route.listen != nil { listenerContexts[route.name] = routeContexts[index] }
    }

    /// The context a request arriving with `head` takes, and how many bytes of its target its route strips.
    /// Without routes, the running context at once: the head is not read. `listenerRoute`: the route whose
    /// own listener the request came in on (everything there is that route's).
    func context(for head: ReceivedRequestHead, listenerRoute: String? = nil) -> (context: ExchangeContext, strip: Int) {
        if let listenerRoute {
            // A listener whose route a reload dropped keeps serving until the restart it needs (ConfigReload
            // keeps such routes): the default context is only a guard that cannot be reached from a file.
            return (listenerContexts[listenerRoute] ?? context, 0)
        }
        if !hasRoutes { return (context, 0) }
        let resolution = head.bytes.withUnsafeBufferPointer { bytes in
            let target = UnsafeBufferPointer(rebasing: bytes[head.parsed.target])
            guard let host = head.parsed.hostField else { return routeTable.resolve(host: nil, target: target) }
            return routeTable.resolve(host: UnsafeBufferPointer(rebasing: bytes[head.parsed.fields[host].value]), target: target)
        }
        // `.none`: the default context answers 404 itself (`answersNotFound`).
        if case .route(let index, let strip) = resolution { return (routeContexts[index], strip) }
        return (context, 0)
    }

    private func makeRoute(_ upstream: Config.Upstream, _ config: Config, upstreamTLS: TLSContext?,
                           listener: (host: String, port: Int)? = nil, reachable: Bool = true) -> UpstreamRoute {
        let route = UpstreamRoute(upstream, config: config, upstreamTLS: upstreamTLS, loop: loop, listenHost: listener?.host,
                                  listenPort: listener?.port ?? boundPort, budget: upstreamBudget, reservesConnections: reachable)
        let desynced: (Int) -> Void = { [unowned self] unread in
            self.metrics.countUpstreamError(kind: "excess_response_bytes")
            self.logger.warning("upstream sent more data than its response; connection closed, not reused",
                                metadata: ["unread_bytes": "\(unread)"])
        }
        route.pool.onUnsolicitedBytes = desynced
        return route
    }

    /// A reload: new requests use `config` (its listen address is the running one: binding again is a
    /// restart). Requests in flight or held keep their route, and with it their upstream and connection;
    /// the old pool is freed as its connections come back.
    /// A request on a route the reload removed reads the default route's settings from then on.
    func apply(_ config: Config, upstreamTLS: TLSContext?, routeTLS: [TLSContext?] = []) {
        self.config = config
        frontEnd.apply(config)
        // Connections in use above a lowered limit are not cut: the limit is reached as they close.
        upstreamBudget.limit = config.limits.maxUpstreamConnections
        retiredRoutes.removeAll { $0.requestsInFlight == 0 }
        let replaced = context!
        let replacedRoutes = zip(routeNames, routeContexts)
        for old in [replaced] + routeContexts {
            old.route.retire()
            retiredRoutes.append(old.route)
        }
        context = makeContext(config, upstream: config.upstream, injection: config.inject, upstreamTLS: upstreamTLS)
        makeRouteContexts(config, routeTLS: routeTLS)
        replaced.replace(with: context)
        for (name, old) in replacedRoutes {
            old.replace(with: routeNames.firstIndex(of: name).map { routeContexts[$0] } ?? context)
        }
    }

    /// Every route's pool, the default route's first.
    private var routePools: [HTTPTransport.UpstreamPool] { [route.pool] + routeContexts.map(\.route.pool) }

    /// Frees every idle upstream connection, old routes' too; only once no request is in flight.
    func closePools() {
        (retiredRoutes.map(\.pool) + routePools).forEach { $0.closeIdle() }
        retiredRoutes = []
    }

    /// The port the proxied listener is bound to.
    var boundPort: Int { frontEnd.map { Int($0.port) } ?? 0 }

    /// Open client connections on the proxied port.
    var clientConnectionCount: Int { frontEnd.openConnections }

    /// Requests queued for an upstream connection.
    var upstreamWaiterCount: Int { routePools.reduce(0) { $0 + $1.waitingCount } }

    /// A request on the transport front end has begun (its head and body are in).
    func began(_ exchange: any ProxiedExchange) {
        changeActive { $0.insert(exchange) }
    }

    /// Changes the list of exchanges in flight moved out of the proxy and back (moves only). An insert or
    /// removal sets an exchange's slot and may grow or free the array, which calls code the compiler
    /// cannot see through; done on the proxy's stored list, that would make it check every access to the
    /// list at run time, twice per request. Done on a local, the accesses are ones it proves exclusive.
    private func changeActive(_ change: (inout ActiveExchanges) -> Void) {
        var list = ActiveExchanges()
        swap(&list, &active)
        change(&list)
        swap(&list, &active)
    }

    /// For ProxyServer+Accounting.swift: the list and its type stay private to this file.
    func removeActive(_ exchange: any ProxiedExchange) {
        changeActive { $0.remove(exchange) }
    }

    var activeCount: Int { active.count }

    /// Every 503 tokenrelay answers by itself (no token, too many held or waiting requests, too many busy
    /// connections, shutting down): logged with its reason, at most once a second per reason.
    func answeredUnavailable(_ response: LocalResponse) {
        let (allowed, heldBack) = unavailableLog.admit(response.message, now: EventLoop.monotonicNow)
        guard allowed else { return }
        var metadata: Logger.Metadata = ["error": "\(response.error)", "reason": "\(response.message)"]
        if heldBack > 0 { metadata["more_since_last_line"] = "\(heldBack)" }
        logger.info("request answered by tokenrelay: service unavailable", metadata: metadata)
    }
    private var unavailableLog = LogRateLimiter(interval: 1)

    /// A request no route takes (and no top-level upstream): one line, its path without the query (which
    /// may carry a secret) and its Host.
    func noRouteMatched(_ head: ReceivedRequestHead) {
        let target = head.target
        let path = target.prefix { $0 != UInt8(ascii: "?") }.prefix(256)
        logger.info("request answered 404: no route matches", metadata: [
            "path": "\(String(decoding: path, as: UTF8.self))", "host": "\(head.field("host").map { String($0.prefix(256)) } ?? "")",
        ])
    }

    /// A request refused before anything was forwarded (smuggling probes, foreign hosts).
    func refused(_ reason: String) {
        logger.info("request refused", metadata: ["reason": "\(reason)"])
    }

    // MARK: - Shutdown

    func startDraining() {
        isDraining = true
        for each in coordinators + retiredCoordinators {
            each.stopRefreshing()
            each.onTokenEndpointIdle = { [unowned self] in self.checkDrained() }
        }
        frontEnd.stopAccepting()
        checkDrained()
    }

    /// Drain deadline passed: answer or cut whatever is left.
    func abandonRemaining() {
        // A copy: each abandon changes the list.
        let remaining = active.all
        remaining.forEach { $0.abandon() }
    }
}

/// Exchanges and tunnels in flight, in no order; each knows its slot (`activeSlot`), so that removing
/// one is a swap with the last, without hashing. A value with mutating methods: each insert or removal
/// is one access to the proxy's stored property.
private struct ActiveExchanges {
    private(set) var all: [any ProxiedExchange] = []

    var count: Int { all.count }
    var isEmpty: Bool { all.isEmpty }

    mutating func insert(_ exchange: any ProxiedExchange) {
        exchange.activeSlot = all.count
        all.append(exchange)
    }

    /// No-op for one that is not in the list (or no longer).
    mutating func remove(_ exchange: any ProxiedExchange) {
        let slot = exchange.activeSlot
        guard all.indices.contains(slot), all[slot] === exchange else { return }
        let last = all.removeLast()
        if slot < all.count {
            last.activeSlot = slot
            all[slot] = last
        }
        exchange.activeSlot = -1
    }
}
