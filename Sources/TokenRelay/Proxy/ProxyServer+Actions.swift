import HTTPTransport
import Logging

/// The lifecycle's actions that involve no connection, the same for every driver (the held list, the refresh
/// rules, counters, the log), and the held requests per identity and route. Part of `ProxyServer`
/// (ProxyServer.swift: identities, routes, contexts and pools, shutdown).
extension ProxyServer {
    // MARK: - Actions that are the same on both engines

    /// What carrying out one of the proxy's actions (`carryOut`) came to, for the driver to tell its machine.
    enum ActionOutcome {
        case done
        /// The list of held requests is full: the machine hears `holdRefused`.
        case holdRefused
        /// The refresh rules' answer to `consultRefreshRules`: the machine hears `refreshRulesDecided`.
        case refreshRulesDecided(RequestLifecycle.RefreshRulesDecision)
    }

    /// Carries out an action of `RequestLifecycle` that involves no connection (the held list, the refresh
    /// rules, counters, the log) for a driver, and says what its machine must hear of it. Drivers pass every
    /// other action to their own transport. The driver feeds the machine itself: the machine is never
    /// lent out across a call into the proxy. `failure`: the one its action list reports, for
    /// `.upstreamFailed` and `.retrying` (actions carry no payload, see `RequestLifecycle.Action`).
    /// `context`: the exchange's; its identity's refresh rules are asked, its identity's list holds it.
    func carryOut(_ action: RequestLifecycle.Action, failure: RequestLifecycle.UpstreamFailure?,
                  for exchange: any ProxiedExchange, context: ExchangeContext) -> ActionOutcome {
        let identity = context.coordinator
        switch action {
        case .hold:
            return hold(exchange, context: context) ? .done : .holdRefused
        case .unhold:
            unhold(exchange)
        case .consultRefreshRules(let sentGeneration):
            return .refreshRulesDecided(identity.unauthorized(sentGeneration: sentGeneration))
        case .reportUnreplayableRefreshTrigger(let sentGeneration):
            logger.info("a refresh-triggering answer to a request whose body cannot be sent again was passed to the client; the refresh rules count it")
            identity.unauthorizedNotReplayable(sentGeneration: sentGeneration)
        case .countReplay(.staleGeneration): metrics.replaysStaleGeneration.increment()
        case .countReplay(.afterRefresh): metrics.replaysAfterRefresh.increment()
        case .upstreamFailed:
            if let failure { upstreamFailed(failure) }
        case .retrying:
            logger.info("retrying on a fresh upstream connection", metadata: ["reason": "\(failure.map { "\($0)" } ?? "")"])
        default:
            assertionFailure("\(action) is the driver's to carry out")
        }
        return .done
    }

    // MARK: - Held requests

    /// Holds `exchange` for its identity's refresh, within its route's share and the process's limit.
    func hold(_ exchange: any ProxiedExchange, context: ExchangeContext) -> Bool {
        guard held.hold(exchange, identity: context.coordinator, route: context.routeName, routeLimit: context.maxHeld,
                        limit: config.limits.maxHeldRequests) else { return false }
        metrics.heldRequests.record(Double(held.count))
        return true
    }

    func unhold(_ exchange: any ProxiedExchange) {
        if held.remove(exchange) { metrics.heldRequests.record(Double(held.count)) }
    }

    var heldCount: Int { held.count }

    /// Held requests of the identity `identity`.
    func heldCount(of identity: RefreshCoordinator) -> Int { held.count(of: identity) }

    /// Held requests that arrived on the route `name` (`default`: the top-level one).
    func heldCount(ofRoute name: String) -> Int { held.count(ofRoute: name) }

    /// Each route's held requests and its share (`Config.heldRequestShare`), the top-level route first when it serves.
    var heldByRoute: [(route: String, held: Int, limit: Int)] {
        let contexts = (config.hasDefaultRoute ? [context!] : []) + routeContexts
        return contexts.map { ($0.routeName, held.count(ofRoute: $0.routeName), $0.maxHeld) }
    }

    /// Releases every request held for `identity`, oldest first, with the outcome of its refresh.
    func refreshFinished(_ outcome: RefreshCoordinator.Outcome, of identity: RefreshCoordinator) {
        let waiting = held.removeAll(of: identity)
        metrics.heldRequests.record(Double(held.count))
        waiting.forEach { $0.refreshFinished(outcome) }
    }
}
