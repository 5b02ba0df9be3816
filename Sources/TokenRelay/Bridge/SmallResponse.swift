import CLibevent

/// Status and whole body of a small response (token endpoint, device login), collected from an
/// `OutgoingRequest`'s callbacks. Bodies beyond `maxBytes` are cut off; evhttp is also told the limit
/// (`evhttp_connection_set_max_body_size`) so a hostile peer cannot make us buffer more.
struct SmallResponse {
    static let maxBytes = 1 << 20

    private(set) var status = 0
    private(set) var body: [UInt8] = []
    /// The `Retry-After` header as sent (the token endpoint's 429 and 503 carry it).
    private(set) var retryAfter: String?

    mutating func receivedHeaders(_ response: OpaquePointer) {
        status = Int(evhttp_request_get_response_code(response))
        retryAfter = HeaderList(raw: evhttp_request_get_input_headers(response)).values("Retry-After").first
    }

    /// Takes the bytes evhttp has buffered (it would drain them after the callback anyway).
    mutating func receivedBody(_ response: OpaquePointer) {
        let input = evhttp_request_get_input_buffer(response)
        if body.count < Self.maxBytes { body += EvBuffer.bytes(input) }
        evbuffer_drain(input, EvBuffer.length(input))
    }
}
