import CNghttp2

/// Moving an nghttp2 session's output (client or server side alike) onto its socket: the frames it has to
/// send, while the socket's unsent bytes stay under a limit (the rest waits for the socket to drain, so a
/// peer that does not read cannot grow our memory), and whether the session has ended.
enum HTTP2SessionOutput {
    /// Writes what the session has to send while the socket holds under `limit` unsent bytes. false: nghttp2
    /// failed (the session is unusable and the connection is to close).
    static func write(_ session: OpaquePointer, to stream: SocketStream, limit: Int) -> Bool {
        while stream.pendingOutput < limit {
            var data: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &data)
            if n < 0 { return false }
            guard n > 0, let data else { break }
            stream.write(UnsafeRawBufferPointer(start: data, count: n))
            if stream.isClosed { break }
        }
        return true
    }

    /// Neither side has anything more to say (after GOAWAY both ways, or a fatal error).
    static func isOver(_ session: OpaquePointer) -> Bool {
        nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0
    }
}
