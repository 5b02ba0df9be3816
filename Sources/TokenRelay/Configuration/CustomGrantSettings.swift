/// The custom grant (`refresh.grant: "custom"`): one templated HTTP request and a JSON Pointer mapping of
/// its response, for APIs with a refresh endpoint of their own. Everything is parsed and checked at start.
public struct CustomGrantSettings: Sendable {
    public enum Method: String, Sendable, CaseIterable {
        case get = "GET", post = "POST", put = "PUT", patch = "PATCH"
    }

    public enum Body: Sendable {
        case none
        case json(JSONTemplate)
        /// Fields in name order (a JSON object has none of its own).
        case form([(name: String, value: StringTemplate)])
    }

    public enum Expiry: Sendable {
        /// Seconds from now (a number or a numeric string).
        case seconds(JSONPointer)
        /// An absolute time: RFC 3339 text or epoch seconds.
        case absolute(JSONPointer)
    }

    public var method = Method.post
    public var url: HTTPEndpoint
    public var headers: [(name: String, value: StringTemplate)] = []
    public var body = Body.none
    public var accessToken: JSONPointer
    public var refreshToken: JSONPointer?
    public var expiry: Expiry?
    /// Statuses that mean "the credentials are dead, log in again"; other 4xx fail the cycle without a
    /// latch, 408/425/429/5xx are retried.
    public var loginRequiredStatuses: Set<Int> = [400, 401, 403]
    /// Where a failure answer carries its error code (e.g. `/error/code`), and the codes that mean
    /// "log in again" whatever the status (some backends answer 200 or 500 with `SESSION_EXPIRED`).
    public var errorCode: JSONPointer?
    public var loginRequiredErrors: Set<String> = []

    /// Placeholders used anywhere in the request.
    public var placeholders: Set<StringTemplate.Placeholder> {
        var used = headers.reduce(into: Set<StringTemplate.Placeholder>()) { $0.formUnion($1.value.placeholders) }
        switch body {
        case .none: break
        case .json(let template): used.formUnion(template.placeholders)
        case .form(let fields): fields.forEach { used.formUnion($0.value.placeholders) }
        }
        return used
    }

    static func read(request: JSONObjectReader, response: JSONObjectReader) throws -> CustomGrantSettings {
        request.declareKeys(["url", "method", "headers", "body_json", "body_form"])
        response.declareKeys(["access_token", "refresh_token", "expires_in", "expires_at", "login_required_statuses", "error",
                              "login_required_errors"])
        let urlText = try request.string("url")
        guard !urlText.contains("{{") else { throw ConfigError(request.fieldPath("url"), "placeholders are not allowed in the URL") }
        let url = try HTTPEndpoint.parse(urlText, field: request.fieldPath("url"))
        var settings = CustomGrantSettings(url: url, accessToken: try pointer(response, "access_token", required: true)!)
        if let methodText = try request.optionalString("method") {
            guard let method = Method(rawValue: methodText.uppercased()) else {
                throw ConfigError(request.fieldPath("method"), "must be one of \(Method.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            settings.method = method
        }
        settings.headers = try readHeaders(request)
        settings.body = try readBody(request)
        if case .none = settings.body {} else if settings.method == .get {
            throw ConfigError(request.fieldPath("method"), "GET cannot carry body_json or body_form")
        }
        try request.rejectUnknownKeys()

        settings.refreshToken = try pointer(response, "refresh_token", required: false)
        switch (try pointer(response, "expires_in", required: false), try pointer(response, "expires_at", required: false)) {
        case let (seconds?, nil): settings.expiry = .seconds(seconds)
        case let (nil, absolute?): settings.expiry = .absolute(absolute)
        case (nil, nil): break
        case (_?, _?): throw ConfigError(response.fieldPath("expires_at"), "set either expires_in or expires_at, not both")
        }
        if let statuses = try response.optionalIntegerArray("login_required_statuses", range: 400...499) {
            settings.loginRequiredStatuses = Set(statuses)
        }
        settings.errorCode = try pointer(response, "error", required: false)
        if let codes = try response.optionalStringArray("login_required_errors") {
            guard settings.errorCode != nil else {
                throw ConfigError(response.fieldPath("login_required_errors"), "needs refresh.response.error (where the code is)")
            }
            settings.loginRequiredErrors = Set(codes)
        }
        try response.rejectUnknownKeys()
        return settings
    }

    private static func pointer(_ object: JSONObjectReader, _ key: String, required: Bool) throws -> JSONPointer? {
        let text: String?
        if required {
            text = try object.string(key)
        } else {
            text = try object.optionalString(key)
        }
        guard let text else { return nil }
        do {
            return try JSONPointer(text)
        } catch {
            throw ConfigError(object.fieldPath(key), "is not a JSON Pointer (RFC 6901): \(error)")
        }
    }

    private static func readHeaders(_ request: JSONObjectReader) throws -> [(name: String, value: StringTemplate)] {
        guard let object = try request.optionalObject("headers") else { return [] }
        return try object.keys.map { name in
            let field = object.fieldPath(name)
            guard HTTPSyntax.isToken(name) else { throw ConfigError(field, "is not an HTTP header name (RFC 9110 token characters only)") }
            guard !HTTPSyntax.reservedHeaderNames.contains(name.lowercased()) else {
                throw ConfigError(field, "is set by tokenrelay itself")
            }
            let template = try StringTemplate(parsing: try object.string(name), field: field)
            guard template.parts.allSatisfy({ if case .literal(let text) = $0 { HTTPSyntax.isSafeHeaderValue(text) } else { true } }) else {
                throw ConfigError(field, "must not contain control characters (CR, LF, ...)")
            }
            return (name, template)
        }
    }

    private static func readBody(_ request: JSONObjectReader) throws -> Body {
        let json = request.optionalValue("body_json")
        let form = try request.optionalObject("body_form")
        switch (json, form) {
        case (nil, nil):
            return .none
        case (let json?, nil):
            return .json(try JSONTemplate.parse(json, field: request.fieldPath("body_json")))
        case (nil, let form?):
            return .form(try form.keys.map { name in (name, try StringTemplate(parsing: try form.string(name), field: form.fieldPath(name))) })
        case (_?, _?):
            throw ConfigError(request.fieldPath("body_form"), "set either body_json or body_form, not both")
        }
    }
}
