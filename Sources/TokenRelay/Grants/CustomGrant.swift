import FoundationEssentials

/// The custom grant's request: the configured template with the current values substituted, each escaped
/// by a real encoder for where it goes (`JSONWriter` for a JSON body, `PercentEncoding` for a
/// form), and header values refused when they would contain a control character.
struct CustomGrant: TokenGrantStrategy {
    let settings: CustomGrantSettings
    let clientID: String
    let clientSecret: String?

    var needsRefreshToken: Bool { settings.placeholders.contains(.refreshToken) }

    func makeRequest(for current: TokenRequestInput) -> Result<TokenHTTPRequest, UnusableRequest> {
        if needsRefreshToken && current.refreshToken == nil { return .failure(UnusableRequest(reason: "no refresh token")) }
        var values: [StringTemplate.Placeholder: String] = [.accessToken: current.accessToken, .clientID: clientID]
        values[.refreshToken] = current.refreshToken
        values[.clientSecret] = clientSecret
        var headers: [(name: String, value: String)] = []
        for header in settings.headers {
            let value = header.value.render(values)
            // Only the name goes into the reason: the value holds a secret.
            guard HTTPSyntax.isSafeHeaderValue(value) else {
                return .failure(UnusableRequest(reason: "the value for request header \(header.name) would contain control characters"))
            }
            headers.append((header.name, value))
        }
        let body: [UInt8]
        let contentType: String?
        switch settings.body {
        case .none:
            (body, contentType) = ([], nil)
        case .json(let template):
            guard let data = try? JSONWriter.data(template.render(values), options: [.sortedKeys, .withoutEscapingSlashes, .fragmentsAllowed]) else {
                return .failure(UnusableRequest(reason: "the JSON body could not be serialised"))
            }
            (body, contentType) = (Array(data), "application/json")
        case .form(let fields):
            (body, contentType) = (Array(FormEncoding.encode(fields.map { ($0.name, $0.value.render(values)) }).utf8),
                                   "application/x-www-form-urlencoded")
        }
        let configured = Set(headers.map { $0.name.lowercased() })
        if let contentType, !configured.contains("content-type") { headers.append(("Content-Type", contentType)) }
        if !configured.contains("accept") { headers.append(("Accept", "application/json")) }
        return .success(TokenHTTPRequest(method: settings.method.rawValue, target: settings.url.requestTarget,
                                         headers: headers, body: body))
    }

    func classify(status: Int, body: [UInt8]) -> TokenEndpointResult {
        CustomResponseMapping(settings: settings).classify(status: status, body: body, now: Date())
    }
}
