import HTTPTransport

/// tokenrelay's own answers (502, 503, 504, 404 …) to a gRPC call on an HTTP/2 stream, as gRPC answers:
/// a Trailers-Only response (`:status 200`, `grpc-status`, `grpc-message`). A gRPC client given an HTTP
/// error status makes up a status of its own from it and drops the body, so the reason (an unreachable
/// upstream, login required, a hold timeout) would never reach the caller's error.
enum GRPCLocalAnswer {
    /// gRPC's own reading of HTTP statuses (what a client derives from them), with the two limits that
    /// have a closer gRPC status: a body or header list over the limits is RESOURCE_EXHAUSTED.
    static func status(forHTTPStatus status: Int32) -> Int {
        switch status {
        case 400, 500: return 13      // INTERNAL
        case 401: return 16           // UNAUTHENTICATED
        case 403: return 7            // PERMISSION_DENIED
        case 404: return 12           // UNIMPLEMENTED
        case 413, 431: return 8       // RESOURCE_EXHAUSTED
        case 429, 502, 503, 504: return 14  // UNAVAILABLE
        default: return 2             // UNKNOWN
        }
    }

    /// Ends the stream with one HEADERS frame carrying the status and message (no DATA).
    static func send<Client: ExchangeClient>(to client: Client, grpcStatus: Int, message: String) {
        client.startResponse(status: 200, reason: UnsafeRawBufferPointer(start: nil, count: 0), body: .none) { block in
            block.append(name: "content-type", value: "application/grpc")
            block.append(name: "grpc-status", value: String(grpcStatus))
            block.append(name: "grpc-message", value: PercentEncoding.encode(message))
        }
    }
}
