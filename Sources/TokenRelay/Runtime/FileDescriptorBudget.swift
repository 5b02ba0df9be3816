import Glibc
import HTTPTransport

/// Makes sure the configured connection limits fit in the process's open-file limit.
///
/// Debian's default soft limit is 1024 while the hard limit is usually far higher; Go, for one, raises
/// the soft limit at start for the same reason. Running out of descriptors would make the proxied listener
/// fail accepts (and log "Too many open files" once per attempt) instead of applying our own limit, which
/// answers clients properly.
enum FileDescriptorBudget {
    /// Descriptors beside connections: listeners, the token file and its lock, DNS, the event loop, logs.
    static let overhead = 64

    /// The client connection limit bounds the main listener and every route's own together
    /// (`ConnectionLimitGroup`), and the upstream connection limit every route's pools (`UpstreamConnectionBudget`).
    static func needed(for limits: Config.Limits) -> Int {
        limits.maxClientConnections + HTTPServer.Settings(maxConnections: limits.maxClientConnections).effectiveOverLimitAllowance
            + limits.maxUpstreamConnections + limits.maxTunnels /* their upstream sides */ + 1 /* token endpoint */ + AdminServer.maxDescriptors + overhead
    }

    /// Raises the soft limit towards `needed` (never above the hard limit). Returns a warning when even
    /// the hard limit is too low.
    static func ensure(for limits: Config.Limits) -> String? {
        let needed = rlim_t(Self.needed(for: limits))
        var limit = rlimit()
        guard getrlimit(openFiles, &limit) == 0 else { return nil }
        guard limit.rlim_cur < needed else { return nil }
        let raised = min(needed, limit.rlim_max)
        var wanted = rlimit(rlim_cur: raised, rlim_max: limit.rlim_max)
        if setrlimit(openFiles, &wanted) == 0 { limit.rlim_cur = raised }
        guard limit.rlim_cur < needed else { return nil }
        return "the open-file limit (\(limit.rlim_cur)) is below the \(needed) descriptors that limits.max_client_connections, "
            + "limits.max_upstream_connections and limits.max_tunnels can use; raise LimitNOFILE or lower the limits"
    }

    private static let openFiles = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
}
