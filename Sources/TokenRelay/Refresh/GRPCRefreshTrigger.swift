/// Decides whether a gRPC answer says "this access token is no longer accepted" (`RefreshTrigger`'s
/// counterpart: gRPC carries it in `grpc-status`, not in the HTTP status).
enum GRPCRefreshTrigger {
    /// `grpcStatus`: the `grpc-status` field of an answer that ended before any response message (the
    /// head's own field in a Trailers-Only response, else the trailers'); nil when it had none.
    /// `triggerStatuses`: `refresh.trigger_grpc_statuses`.
    static func indicatesExpiredToken(grpcStatus: String?, triggerStatuses: Set<Int>) -> Bool {
        guard let code = statusCode(grpcStatus) else { return false }
        return triggerStatuses.contains(code)
    }

    /// The value as a status code: one to three ASCII digits, nothing else (no sign, no space). The value
    /// is the upstream's: anything else is no status, never a number read past its end or an overflow.
    static func statusCode(_ value: String?) -> Int? {
        guard let utf8 = value?.utf8, (1...3).contains(utf8.count) else { return nil }
        var code = 0
        for byte in utf8 {
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return nil }
            code = code * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return code
    }
}
