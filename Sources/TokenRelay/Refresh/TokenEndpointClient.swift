import CLibevent
import Foundation

/// Performs the OAuth 2.0 refresh_token grant (RFC 6749 §6) against the configured token endpoint.
///
/// It has its own `evhttp_connection`, so a refresh never queues behind the proxied requests it is
/// about to release, and it is not tied to any client: a client that gives up does not cancel it.
/// It never retries by itself and never switches client-authentication style, because each attempt
/// presents the refresh token, and with rotation a second presentation of a consumed token revokes the
/// whole session. Retrying is the coordinator's decision.
final class TokenEndpointClient: OutgoingRequestDelegate {
    private let endpoint: HTTPEndpoint
    private let settings: Config.Refresh
    private let clientSecret: String?
    private let connection: OpaquePointer?
    private var call: OutgoingRequest?
    private var status = 0
    private var body: [UInt8] = []
    private var completion: ((TokenEndpointResult) -> Void)?
    private static let maxResponseBytes = 1 << 20

    init(factory: HTTPConnectionFactory, settings: Config.Refresh, clientSecret: String?) {
        endpoint = settings.tokenURL
        self.settings = settings
        self.clientSecret = clientSecret
        connection = factory.makeConnection()
        if let connection { evhttp_connection_set_max_body_size(connection, Int(Self.maxResponseBytes)) }
    }

    deinit {
        call?.cancel()
        if let connection { evhttp_connection_free(connection) }
    }

    var isBusy: Bool { call != nil }

    func refresh(refreshToken: String, completion: @escaping (TokenEndpointResult) -> Void) {
        precondition(call == nil, "one refresh at a time")
        self.completion = completion
        status = 0
        body = []
        let form = formBody(refreshToken: refreshToken)
        let request = OutgoingRequest(delegate: self)
        call = request
        guard let connection else {
            return finish(.transient(reason: "could not create a connection to the token endpoint", outcomeUnknown: false))
        }
        let started = request.start(on: connection, method: EVHTTP_REQ_POST, target: endpoint.requestTarget) { req in
            let headers = HeaderList(raw: evhttp_request_get_output_headers(req))
            headers.add("Host", endpoint.authority)
            headers.add("Content-Type", "application/x-www-form-urlencoded")
            headers.add("Accept", "application/json")
            headers.add("Content-Length", String(form.utf8.count))
            if settings.clientAuth == .clientSecretBasic {
                headers.add("Authorization", basicCredentials())
            }
            EvBuffer.append(evhttp_request_get_output_buffer(req), form)
        }
        if !started {
            finish(.transient(reason: "could not start a request to the token endpoint", outcomeUnknown: false))
        }
    }

    /// Form body of the refresh request; client credentials go here only for client_secret_post.
    private func formBody(refreshToken: String) -> String {
        var fields = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope = settings.scope { fields.append(("scope", scope)) }
        switch settings.clientAuth {
        case .clientSecretPost:
            fields.append(("client_id", settings.clientID))
            fields.append(("client_secret", clientSecret ?? ""))
        case .none:
            fields.append(("client_id", settings.clientID))
        case .clientSecretBasic:
            break
        }
        return FormEncoding.encode(fields)
    }

    /// RFC 6749 §2.3.1: id and secret are form-encoded before being joined and base64-encoded.
    private func basicCredentials() -> String {
        let pair = "\(FormEncoding.escape(settings.clientID)):\(FormEncoding.escape(clientSecret ?? ""))"
        return "Basic " + Data(pair.utf8).base64EncodedString()
    }

    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer) {
        status = Int(evhttp_request_get_response_code(response))
    }

    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer) {
        let input = evhttp_request_get_input_buffer(response)
        if body.count < Self.maxResponseBytes { body += EvBuffer.bytes(input) }
        evbuffer_drain(input, EvBuffer.length(input))
    }

    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>) {
        switch result {
        case .success:
            finish(TokenEndpointResult.classify(status: status, body: body))
        case .failure(let failure):
            finish(.transient(reason: "token endpoint \(failure)", outcomeUnknown: failure.mayHaveReachedPeer))
        }
    }

    private func finish(_ result: TokenEndpointResult) {
        call = nil
        body = []
        let completion = self.completion
        self.completion = nil
        completion?(result)
    }
}

/// application/x-www-form-urlencoded, using libevent's encoder (everything but RFC 3986 unreserved
/// characters is percent-encoded).
enum FormEncoding {
    static func escape(_ value: String) -> String {
        guard let encoded = evhttp_uriencode(value, -1, 0) else { return "" }
        defer { free(encoded) }
        return String(cString: encoded)
    }

    static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }
}
