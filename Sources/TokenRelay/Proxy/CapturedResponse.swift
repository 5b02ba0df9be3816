import CLibevent

/// An upstream 401 kept while its request waits for a refresh: if the refresh is rejected, the client
/// gets exactly this response (status, headers, body), as if tokenrelay were not there.
struct CapturedResponse {
    static let maxBodyBytes = 64 * 1024

    let status: Int32
    let reason: String
    let headers: [(name: String, value: String)]
    private(set) var body: [UInt8] = []

    init(response: OpaquePointer) {
        status = evhttp_request_get_response_code(response)
        reason = evhttp_request_get_response_code_line(response).map { String(cString: $0) } ?? "Unauthorized"
        headers = HeaderList(raw: evhttp_request_get_input_headers(response)).entries
    }

    mutating func append(from buffer: OpaquePointer) {
        let room = Self.maxBodyBytes - body.count
        let available = EvBuffer.length(buffer)
        if room > 0 { body += EvBuffer.bytes(buffer).prefix(room) }
        evbuffer_drain(buffer, available)
    }
}
