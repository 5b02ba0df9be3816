import Logging

/// One access-log line per client request: method, path (query left out by default: it often carries
/// identifiers or credentials of its own; when `log.access_query` includes it, credential-like parameter
/// values are redacted; an absolute-form authority, with any user:pass@, never logged), status, duration,
/// upstream attempts and token generation.
struct AccessLogEntry {
    let method: String
    let target: String?
    let status: Int32
    let seconds: Double
    let attempts: Int
    let generation: UInt64

    func log(to logger: Logger, includeQuery: Bool) {
        let path = Self.loggedPath(target, includeQuery: includeQuery)
        logger.info("request", metadata: [
            "method": "\(method)",
            "path": "\(path)",
            "status": "\(status)",
            "duration_ms": "\(Int((seconds * 1000).rounded()))",
            "attempts": "\(attempts)",
            "generation": "\(generation)",
        ])
    }

    /// The path as logged. A fragment counts as query (`QueryRedaction`): a client forwarding a whole URL
    /// sends one, and an implicit grant's `#access_token=` would otherwise be logged with the path.
    static func loggedPath(_ target: String?, includeQuery: Bool) -> String {
        var path = target ?? "-"
        // Absolute-form (`http://user:pass@host/p`): keep the path only, never the authority's credentials.
        if let scheme = path.firstRange(of: "://") {
            path = path[scheme.upperBound...].firstIndex(of: "/").map { String(path[$0...]) } ?? "/"
        }
        if !includeQuery, let query = path.firstIndex(where: QueryRedaction.startsQuery) {
            return String(path[..<query])
        }
        return QueryRedaction.redact(path)
    }
}
