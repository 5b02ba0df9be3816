/// Responses tokenrelay writes itself, with a small JSON body that says what happened.
struct LocalResponse {
    let status: Int32
    let reason: String
    var headers: [(name: String, value: String)] = [("Content-Type", "application/json")]
    let body: String
    /// The `error` and `message` of the body, for the log.
    let error: String
    let message: String

    init(status: Int32, reason: String, error: String, message: String, extraHeaders: [(String, String)] = []) {
        self.status = status
        self.reason = reason
        self.error = error
        self.message = message
        headers += extraHeaders.map { (name: $0.0, value: $0.1) }
        body = "{\"error\":\"\(error)\",\"message\":\"\(Self.jsonEscaped(message))\"}\n"
    }

    /// Messages may carry text from elsewhere (an OpenSSL error string); it must not break the JSON.
    private static func jsonEscaped(_ text: String) -> String {
        var escaped = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                escaped += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default:
                escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }

    static let loginRequired = LocalResponse(
        status: 401, reason: "Unauthorized", error: "login_required",
        message: "tokenrelay's refresh token was rejected; a new login is needed",
        extraHeaders: [("WWW-Authenticate", "Bearer error=\"invalid_token\", error_description=\"login required\"")])

    static func unavailable(_ message: String, retryAfter: Int = 5) -> LocalResponse {
        LocalResponse(status: 503, reason: "Service Unavailable", error: "token_unavailable", message: message,
                      extraHeaders: [("Retry-After", String(max(1, retryAfter)))])
    }

    /// The last refresh's outcome is unknown and the refresh token may not be presented again yet.
    static func refreshOnHold(retryAfter: Int) -> LocalResponse {
        unavailable("the last token refresh's outcome is unknown; no new token before the refresh hold-off ends", retryAfter: retryAfter)
    }

    /// A refresh-triggering answer when refreshing has stopped for the request's identity.
    static let noRefresh = unavailable("no token refresh will run: tokenrelay is shutting down or its identity was removed", retryAfter: 1)

    static let tooManyHeld = LocalResponse(
        status: 503, reason: "Service Unavailable", error: "overloaded",
        message: "too many requests are waiting for a token refresh", extraHeaders: [("Retry-After", "1")])

    static let tooManyConnections = LocalResponse(
        status: 503, reason: "Service Unavailable", error: "overloaded",
        message: "too many client connections are busy (limits.max_client_connections)", extraHeaders: [("Retry-After", "1")])

    static let tooManyTunnels = LocalResponse(
        status: 503, reason: "Service Unavailable", error: "overloaded",
        message: "too many upgraded connections are open (limits.max_tunnels)", extraHeaders: [("Retry-After", "1")])

    static let noRoute = LocalResponse(
        status: 404, reason: "Not Found", error: "no_route", message: "no route matches this request (routes) and there is no top-level upstream")

    static let traceRefused = LocalResponse(
        status: 405, reason: "Method Not Allowed", error: "method_not_allowed", message: "TRACE is not forwarded (it would echo the injected token)")

    static let connectRefused = LocalResponse(
        status: 405, reason: "Method Not Allowed", error: "method_not_allowed", message: "CONNECT is not supported")

    static let headTooLarge = LocalResponse(
        status: 431, reason: "Request Header Fields Too Large", error: "header_too_large",
        message: "the request head is larger than limits.max_header_bytes")

    static let bodyTooLarge = LocalResponse(
        status: 413, reason: "Payload Too Large", error: "body_too_large",
        message: "the request body is larger than limits.max_body_bytes")

    static let versionNotSupported = LocalResponse(
        status: 505, reason: "HTTP Version Not Supported", error: "http_version_not_supported", message: "only HTTP/1.0 and HTTP/1.1 are supported")

    static func badRequest(_ message: String) -> LocalResponse {
        LocalResponse(status: 400, reason: "Bad Request", error: "bad_request", message: message)
    }

    static func poolExhausted(_ message: String) -> LocalResponse {
        LocalResponse(status: 503, reason: "Service Unavailable", error: "overloaded", message: message,
                      extraHeaders: [("Retry-After", "1")])
    }

    static func badGateway(_ message: String) -> LocalResponse {
        LocalResponse(status: 502, reason: "Bad Gateway", error: "bad_gateway", message: message)
    }

    static let gatewayTimeout = LocalResponse(
        status: 504, reason: "Gateway Timeout", error: "gateway_timeout", message: "the upstream did not answer in time")
}
