/// gRPC's 401: an expired token comes back as `:status 200` with `grpc-status: 16` (UNAUTHENTICATED),
/// usually as a Trailers-Only response. The HTTP status says nothing, so the rule is on the status field, and
/// it holds only while nothing of the answer has reached the client: a status that comes after a response
/// message ends a call the client has partly seen, which can never be replaced by a replay's answer.
///
/// The driver therefore holds a gRPC response's head back (`withholdsGRPCResponseHead`) until the first
/// response message or the end of the answer, and reports an answer that ended with no message through
/// `grpcStatusBeforeMessage` instead of `responseHead`. From there it is the 401 path: captured, one
/// coalesced refresh, replayed once on a fresh stream; a second refusal after the replay is the client's.
extension RequestLifecycle {
    /// Whether the driver holds a gRPC response's head back until its first message or its end: only while a
    /// refusal could still be replayed (the first send, a token, a body still whole). A replay, a passthrough
    /// request or a streamed body gets its head relayed at once: its status would be the client's anyway.
    var withholdsGRPCResponseHead: Bool { answerMayBeReplaced }

    /// The head of a gRPC answer is in and withheld (`withholdsGRPCResponseHead`) until its first message or
    /// its end. `upstream_seconds` was for the head: what follows is the silence of a started answer, which
    /// `timeouts.stream_idle_seconds` bounds, as for any response (a watch-style server-streaming call may
    /// wait minutes for its first message; cut by the head deadline it got a 504 after 60 s). Still nothing
    /// has reached the client, so that deadline passing answers 504. The head also proves the connection.
    mutating func responseHeadWithheld() -> ActionList {
        guard phase == .awaitingResponse else { return ActionList() }
        return connected() + ActionList(.schedule(.responseHead, after: settings.streamIdleSeconds))
    }

    /// A gRPC answer ended with no response message: Trailers-Only (the HEADERS with `:status` carried
    /// END_STREAM), or HEADERS then trailers with no DATA; its head has not reached the client.
    /// `indicatesExpiredToken`: its `grpc-status` is one of `refresh.trigger_grpc_statuses` (see
    /// `GRPCRefreshTrigger`). Everything else follows `responseHead`: the first answer to a kept body is
    /// captured for the refresh rules; one to a streamed body that has started to leave is the client's, and
    /// the refresh rules still hear of it (the token is as dead as for a 401).
    mutating func grpcStatusBeforeMessage(status: Int, indicatesExpiredToken: Bool) -> ActionList {
        guard phase == .awaitingResponse else { return ActionList() }
        let actions = responseHead(status: status, indicatesExpiredToken: indicatesExpiredToken)
        capturedGRPCRefusal = phase == .capturing
        return actions
    }
}
