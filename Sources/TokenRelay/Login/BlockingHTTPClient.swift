import CLibevent

/// Sends one request at a time to one endpoint over the libevent bridge and blocks until the answer is
/// in. `tokenrelay login` is a one-shot command with nothing else to serve, so running a private event
/// loop per request is the simplest correct client — and going through `HTTPConnectionFactory` gives it
/// https, `refresh.tls` and the TLS failure diagnostics exactly as the proxy has them.
final class BlockingHTTPClient: OutgoingRequestDelegate {
    struct Response {
        let status: Int
        let body: [UInt8]
    }

    private let loop: EventLoop
    private let factory: HTTPConnectionFactory
    private var response = SmallResponse()
    private var outcome: Result<Response, OutgoingFailure>?

    init(endpoint: HTTPEndpoint, tls: TLSContext?, timeoutSeconds: Double) throws {
        loop = try EventLoop()
        factory = HTTPConnectionFactory(loop: loop, endpoint: endpoint, tls: tls, timeoutSeconds: timeoutSeconds)
    }

    func send(_ prepared: TokenHTTPRequest) -> Result<Response, OutgoingFailure> {
        self.response = SmallResponse()
        outcome = nil
        // A fresh connection per request: between two polls the server may well close an idle one, and
        // with retries off a stale keep-alive connection would turn into a spurious failure.
        guard let connection = factory.makeConnection() else { return .failure(OutgoingFailure(kind: .connect, afterResponseStarted: false)) }
        defer { evhttp_connection_free(connection) }
        evhttp_connection_set_max_body_size(connection, SmallResponse.maxBytes)
        let authority = factory.endpoint.authority
        let request = OutgoingRequest(delegate: self)
        let started = request.start(on: connection, method: prepared.method, target: prepared.target) { req in
            prepared.write(into: req, authority: authority)
        }
        guard started else { return .failure(OutgoingFailure(kind: .connect, afterResponseStarted: false)) }
        if outcome == nil { loop.run() }
        // The loop only runs out of events without an outcome if evhttp dropped the request silently.
        return outcome ?? .failure(OutgoingFailure(kind: .connectionLost, afterResponseStarted: false))
    }

    func outgoingRequestReceivedHeaders(_ call: OutgoingRequest, response: OpaquePointer) {
        self.response.receivedHeaders(response)
    }

    func outgoingRequestReceivedBody(_ call: OutgoingRequest, response: OpaquePointer) {
        self.response.receivedBody(response)
    }

    func outgoingRequestFinished(_ call: OutgoingRequest, result: Result<OpaquePointer, OutgoingFailure>) {
        outcome = result.map { _ in Response(status: response.status, body: response.body) }
        loop.stop()
    }
}
