import Foundation

/// Ordered header fields with case-insensitive lookup. Fields stay a plain `[(String, String)]`
/// (order and duplicates preserved) because header order/duplication is exactly what proxy tests
/// need to assert on; lookup is added by this protocol instead of a dictionary that would lose both.
protocol HeaderFieldLookup {
    var headers: [(String, String)] { get }
}

extension HeaderFieldLookup {
    /// First value of `name` (case-insensitive), or nil.
    func header(_ name: String) -> String? { headers(named: name).first }
    /// All values of `name` in order of appearance.
    func headers(named name: String) -> [String] {
        headers.filter { $0.0.caseInsensitiveCompare(name) == .orderedSame }.map(\.1)
    }
    /// Comma-separated tokens across all fields of `name`, lowercased (e.g. Connection, Transfer-Encoding).
    func headerTokens(_ name: String) -> [String] {
        headers(named: name).flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
    }
}

/// A request as received by `MiniHTTPServer`, exactly as the proxy sent it upstream.
struct RecordedRequest: Sendable, HeaderFieldLookup {
    let method: String
    /// The request target as on the request line, e.g. `/a/b?x=1`.
    let target: String
    let version: String
    let headers: [(String, String)]
    /// The decoded body (chunked framing removed).
    let body: Data
    /// Same value = same TCP connection; lets tests assert on upstream keep-alive reuse.
    let connectionID: Int
    /// Whether the body arrived with `Transfer-Encoding: chunked`.
    let wasChunked: Bool

    var path: String { String(target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)[0]) }
    var query: String? {
        let parts = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        return parts.count == 2 ? String(parts[1]) : nil
    }
    var bodyText: String { String(decoding: body, as: UTF8.self) }
}

/// What a `MiniHTTPServer` handler answers. The server always writes Content-Length itself (and
/// drops any Content-Length/Transfer-Encoding given here), so handlers cannot produce bad framing
/// by accident. A `Connection: close` header makes the server close after the response.
struct TestResponse: Sendable {
    var status: Int
    var reason: String
    var headers: [(String, String)]
    var body: Data

    init(status: Int = 200, reason: String? = nil, headers: [(String, String)] = [], body: Data = Data()) {
        self.status = status
        self.reason = reason ?? TestResponse.defaultReason(status)
        self.headers = headers
        self.body = body
    }

    /// A JSON response (keys sorted, so bodies are deterministic).
    static func json(_ status: Int, _ object: [String: Any], headers: [(String, String)] = []) -> TestResponse {
        let body = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return TestResponse(status: status, headers: [("Content-Type", "application/json")] + headers, body: body)
    }

    static func defaultReason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 201: "Created"
        case 204: "No Content"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 429: "Too Many Requests"
        case 500: "Internal Server Error"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        default: "Status \(status)"
        }
    }
}

/// A response as read by `HTTPTestClient`.
struct TestHTTPResponse: Sendable, HeaderFieldLookup {
    let version: String
    let status: Int
    let reason: String
    let headers: [(String, String)]
    /// The decoded body (chunked framing removed).
    let body: Data
    /// Whether the body arrived with `Transfer-Encoding: chunked`.
    let wasChunked: Bool

    var bodyText: String { String(decoding: body, as: UTF8.self) }
    /// The body parsed as a JSON object, or nil if it is not one.
    func json() -> [String: Any]? { (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] }
}
