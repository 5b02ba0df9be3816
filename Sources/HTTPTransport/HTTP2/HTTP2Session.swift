import CNghttp2

/// The nghttp2 server session of an `HTTP2ServerConnection`: its options (the protections against the
/// known HTTP/2 floods) and its callbacks, which pass what nghttp2 parsed to the connection.
enum HTTP2Session {
    /// Creates the session and queues our SETTINGS. False if nghttp2 could not allocate it.
    static func makeServer(_ session: inout OpaquePointer?, for connection: HTTP2ServerConnection,
                           settings: HTTP2ServerConnection.Settings) -> Bool {
        // Request bodies wait for their upstream by flow control, and the flood limits apply (see
        // `HTTP2SessionConnection.makeSession`).
        let made = HTTP2ServerConnection.makeSession(&session, for: connection, register: { callbacks in
            nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
            nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
            nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
            nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
            nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        }, moreOptions: { option in
            // Rapid reset (CVE-2023-44487): streams the client resets are counted by a token bucket (a burst of
            // 1000, then 33 a second); past it the connection ends with GOAWAY.
            nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33)
        }, create: { nghttp2_session_server_new2($0, $1, $2, $3) })
        guard made, let session else { return false }
        return HTTP2ServerConnection.submitSettings(session, [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                                   value: UInt32(clamping: max(1, settings.maxConcurrentStreams))),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                                   value: UInt32(clamping: max(1, settings.maxHeadBytes))),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: UInt32(Self.streamWindow)),
        ], streams: settings.maxConcurrentStreams, streamWindow: Self.streamWindow)
    }

    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE).
    static let streamWindow = 256 * 1024

    static let temporalFailure = Int32(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)

    private static func connection(_ userData: UnsafeMutableRawPointer?) -> HTTP2ServerConnection? {
        HTTP2ServerConnection.from(userData)
    }

    private static func isRequestHeaders(_ frame: UnsafePointer<nghttp2_frame>) -> Bool {
        frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) && frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
    }

    private static let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
        guard let frame, let connection = connection(userData), isRequestHeaders(frame) else { return 0 }
        connection.beginRequest(frame.pointee.hd.stream_id)
        return 0
    }

    private static let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
        guard let frame, let connection = connection(userData),
              let stream = connection.stream(frame.pointee.hd.stream_id) else { return 0 }
        // Request headers and request trailers both arrive here: the trailers are kept apart (relayed to an
        // HTTP/2 upstream, dropped for an HTTP/1.1 one).
        guard isRequestHeaders(frame) else {
            stream.addTrailer(name: UnsafeRawBufferPointer(start: name, count: nameLength),
                              value: UnsafeRawBufferPointer(start: value, count: valueLength))
            return 0
        }
        stream.addField(name: UnsafeRawBufferPointer(start: name, count: nameLength),
                        value: UnsafeRawBufferPointer(start: value, count: valueLength))
        return 0
    }

    private static let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
        guard let frame, let connection = connection(userData) else { return 0 }
        let id = frame.pointee.hd.stream_id
        let endStream = frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        switch UInt32(frame.pointee.hd.type) {
        case NGHTTP2_HEADERS.rawValue:
            guard let stream = connection.stream(id) else { return 0 }
            if isRequestHeaders(frame) {
                connection.headComplete(stream, endStream: endStream)
            } else if endStream {
                // Request trailers: they end the body (relayed to an HTTP/2 upstream only).
                stream.receivedEnd()
            }
        case NGHTTP2_DATA.rawValue:
            if endStream { connection.stream(id)?.receivedEnd() }
        default:
            break
        }
        return 0
    }

    private static let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, id, data, length, userData in
        HTTP2ServerConnection.onDataChunk(id, data, length, userData)
    }

    private static let onStreamClose: nghttp2_on_stream_close_callback = { _, id, errorCode, userData in
        HTTP2ServerConnection.onStreamClose(id, errorCode, userData)
    }

    /// nghttp2 asks for a response's next DATA bytes.
    static let readBody: nghttp2_data_source_read_callback = { _, id, buffer, length, flags, _, userData in
        HTTP2ServerConnection.onReadBody(id, buffer, length, flags, userData)
    }
}
