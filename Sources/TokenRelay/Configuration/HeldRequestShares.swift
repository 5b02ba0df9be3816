/// How `limits.max_held_requests` is divided among the routes. Without a default share, a route flooding its
/// identity's refresh (every request held while the token endpoint hangs) could take every slot of the process,
/// and another route whose token dies at that moment would find none: its requests would be refused although
/// its own refresh works. So a route without its own `routes[].max_held_requests` gets an equal share of what
/// the explicit ones leave. The global limit still bounds the process (`HeldRequests`), so explicit values
/// adding up to more than it are allowed (a config that ran before still runs) and only warned about.
extension Config {
    /// The most requests route `index` (nil: the top-level route) may hold at once: its own
    /// `routes[].max_held_requests`, else `limits.max_held_requests` minus the explicit values, divided among the
    /// routes without one (the top-level route counts when it serves), at least 1. A config with a single
    /// route, or without routes, gives it the whole global limit as before.
    public func heldRequestShare(route index: Int?) -> Int {
        if let index, index < routes.count, let own = routes[index].maxHeldRequests { return own }
        let sharing = heldRequestSharing
        guard sharing.routes > 0 else { return limits.maxHeldRequests }
        return max(1, max(0, limits.maxHeldRequests - sharing.explicit) / sharing.routes)
    }

    /// The sum of the explicit route limits and how many routes share the rest.
    private var heldRequestSharing: (explicit: Int, routes: Int) {
        // Each value is at most 1,000,000 and the routes are a config's: the sum cannot overflow.
        let explicit = routes.reduce(0) { $0 + ($1.maxHeldRequests ?? 0) }
        let sharing = routes.filter { $0.maxHeldRequests == nil }.count + (hasDefaultRoute ? 1 : 0)
        return (explicit, sharing)
    }

    /// One line for `check` and the start-up log when the explicit route limits do not fit the global one; nil
    /// when they do.
    public var heldRequestShareWarning: String? {
        let sharing = heldRequestSharing
        let global = limits.maxHeldRequests
        if sharing.explicit > global {
            let rest = sharing.routes > 0 ? "; the routes without one may hold 1 request each" : ""
            return "routes[].max_held_requests add up to \(sharing.explicit), more than limits.max_held_requests (\(global)),"
                + " which still bounds the process: a route may be refused before reaching its own limit\(rest)"
        }
        if sharing.routes > global - sharing.explicit {
            return "routes[].max_held_requests leave \(global - sharing.explicit) of limits.max_held_requests (\(global)) for"
                + " \(sharing.routes) routes without one: each may hold 1 request, and together more than the rest"
        }
        return nil
    }
}
