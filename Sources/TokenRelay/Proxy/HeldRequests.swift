/// Requests waiting for a refresh, oldest first, per identity (its coordinator): a refresh releases only
/// its own identity's requests. Bounded per route (`routes[].max_held_requests`, the route's share) and in
/// all (`limits.max_held_requests`): a route flooding its identity's refresh fills its own slots, never
/// those another route was given.
struct HeldRequests {
    private var lists: [ObjectIdentifier: [(exchange: any ProxiedExchange, route: String)]] = [:]
    private var byRoute: [String: Int] = [:]
    private(set) var count = 0

    /// False when the route or the process is at its limit (the request is then answered 503).
    mutating func hold(_ exchange: any ProxiedExchange, identity: RefreshCoordinator, route: String, routeLimit: Int, limit: Int) -> Bool {
        let key = ObjectIdentifier(identity)
        var list = lists[key] ?? []
        if list.contains(where: { $0.exchange === exchange }) { return true }
        let routeHeld = byRoute[route] ?? 0
        guard count < limit, routeHeld < routeLimit else { return false }
        list.append((exchange, route))
        lists[key] = list
        byRoute[route] = routeHeld + 1
        count += 1
        return true
    }

    /// False when it was not held.
    mutating func remove(_ exchange: any ProxiedExchange) -> Bool {
        for (key, var list) in lists {
            guard let index = list.firstIndex(where: { $0.exchange === exchange }) else { continue }
            let route = list.remove(at: index).route
            lists[key] = list
            released(route)
            return true
        }
        return false
    }

    /// Every request held for `identity`, oldest first, no longer counted.
    mutating func removeAll(of identity: RefreshCoordinator) -> [any ProxiedExchange] {
        let waiting = lists.removeValue(forKey: ObjectIdentifier(identity)) ?? []
        waiting.forEach { released($0.route) }
        return waiting.map(\.exchange)
    }

    func count(of identity: RefreshCoordinator) -> Int { lists[ObjectIdentifier(identity)]?.count ?? 0 }

    func count(ofRoute name: String) -> Int { byRoute[name] ?? 0 }

    private mutating func released(_ route: String) {
        count -= 1
        let left = (byRoute[route] ?? 1) - 1
        byRoute[route] = left > 0 ? left : nil
    }
}
