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
        var path = target ?? "-"
        // Absolute-form (`http://user:pass@host/p`): keep the path only, never the authority's credentials.
        if let scheme = path.firstRange(of: "://") {
            path = path[scheme.upperBound...].firstIndex(of: "/").map { String(path[$0...]) } ?? "/"
        }
        if !includeQuery, let question = path.firstIndex(of: "?") {
            path = String(path[..<question])
        } else {
            path = QueryRedaction.redact(path)
        }
        logger.info("request", metadata: [
            "method": "\(method)",
            "path": "\(path)",
            "status": "\(status)",
            "duration_ms": "\(Int((seconds * 1000).rounded()))",
            "attempts": "\(attempts)",
            "generation": "\(generation)",
        ])
    }
}
