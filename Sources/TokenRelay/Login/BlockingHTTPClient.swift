import HTTPTransport

/// Sends one request at a time to one endpoint and blocks until the answer is in. `tokenrelay login` is
/// a one-shot command with nothing else to serve, so running a private transport loop per request is the
/// simplest correct client, and `HTTPExchange` gives it https, `refresh.tls` and the TLS failure reasons
/// exactly as the relay's token-endpoint client has them.
final class BlockingHTTPClient {
    struct Response {
        let status: Int
        let body: [UInt8]
        var fields: [(name: String, value: String)] = []

        /// The first field of that name (case-insensitive).
        func field(_ name: String) -> String? {
            fields.first { $0.name.lowercased() == name.lowercased() }?.value
        }
    }

    private let loop: TransportLoop
    private let endpoint: HTTPEndpoint
    private let tls: TransportTLSClientContext?
    private let timeoutSeconds: Double

    init(endpoint: HTTPEndpoint, tls: TLSContext?, timeoutSeconds: Double) throws {
        loop = try TransportLoop()
        self.endpoint = endpoint
        self.tls = tls?.transport
        self.timeoutSeconds = timeoutSeconds
    }

    /// Each request gets a fresh connection (an `HTTPExchange`): between two polls the server may well
    /// close an idle one. Returns within `timeoutSeconds` (the exchange's own deadline ends the loop).
    func send(_ prepared: TokenHTTPRequest) -> Result<Response, HTTPExchange.Failure> {
        var outcome: Result<HTTPExchange.Response, HTTPExchange.Failure>?
        let limits = HTTPExchange.Limits(timeoutSeconds: timeoutSeconds, maxBodyBytes: TokenEndpointClient.maxResponseBytes)
        let exchange = HTTPExchange(loop: loop, request: prepared.exchangeRequest(to: endpoint, tls: tls), limits: limits) { [loop] result in
            outcome = result
            loop.stop()
        }
        // The completion never runs inside init, so the loop always runs until it has.
        withExtendedLifetime(exchange) { loop.run() }
        guard let outcome else { return .failure(.connectionLost(responseStarted: false, cause: "the exchange ended without an outcome")) }
        return outcome.map { Response(status: $0.status, body: $0.body, fields: $0.fields) }
    }
}
