import CNghttp2

/// The nghttp2 server session of an `HTTP2ServerConnection`: its options (the protections against the
/// known HTTP/2 floods) and its callbacks, which pass what nghttp2 parsed to the connection.
enum HTTP2Session {
    /// Creates the session and queues our SETTINGS. False if nghttp2 could not allocate it.
    static func makeServer(_ session: inout OpaquePointer?, for connection: HTTP2ServerConnection,
                           settings: HTTP2ServerConnection.Settings) -> Bool {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return false }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)

        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { return false }
        defer { nghttp2_option_del(option) }
        // Request bodies are acknowledged (WINDOW_UPDATE) only once they were handed on: a stream whose
        // upstream is slow stops its client by flow control instead of being buffered.
        nghttp2_option_set_no_auto_window_update(option, 1)
        // CONTINUATION flood: at most 8 CONTINUATION frames after a HEADERS (the header list limit is ours).
        nghttp2_option_set_max_continuations(option, 8)
        // Rapid reset (CVE-2023-44487): streams the client resets are counted by a token bucket (a burst of
        // 1000, then 33 a second); past it the connection ends with GOAWAY.
        nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33)
        // SETTINGS with many entries, and SETTINGS or PING floods whose ACKs the client never reads: at most
        // 32 entries a frame, 1000 queued ACKs, past which the connection ends.
        nghttp2_option_set_max_settings(option, 32)
        nghttp2_option_set_max_outbound_ack(option, 1000)

        let context = Unmanaged.passUnretained(connection).toOpaque()
        guard nghttp2_session_server_new2(&session, callbacks, context, option) == 0, let session else { return false }
        var entries = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                                   value: UInt32(clamping: max(1, settings.maxConcurrentStreams))),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                                   value: UInt32(clamping: max(1, settings.maxHeadBytes))),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: UInt32(Self.streamWindow)),
        ]
        guard nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count) == 0 else { return false }
        // The connection's own window starts at 65,535 bytes whatever SETTINGS say (SETTINGS size streams'
        // windows only): one stream whose body is held (waiting for a refresh, or for a slow upstream) would
        // use it up and stall every other upload on the connection. It is opened to what all streams' windows
        // add up to, so a held stream can only ever stop itself (docs/nghttp2.md).
        let connectionWindow = Int32(clamping: max(1, settings.maxConcurrentStreams) &* Self.streamWindow)
        return nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, connectionWindow) == 0
    }

    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE).
    static let streamWindow = 256 * 1024

    static let temporalFailure = Int32(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)

    private static func connection(_ userData: UnsafeMutableRawPointer?) -> HTTP2ServerConnection? {
        guard let userData else { return nil }
        return Unmanaged<HTTP2ServerConnection>.fromOpaque(userData).takeUnretainedValue()
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
        guard let connection = connection(userData) else { return 0 }
        guard let stream = connection.stream(id) else {
            // A stream already answered or refused: its data is acknowledged and dropped.
            connection.consume(id, length)
            return 0
        }
        stream.receivedBody(UnsafeRawBufferPointer(start: data, count: length))
        return 0
    }

    private static let onStreamClose: nghttp2_on_stream_close_callback = { _, id, errorCode, userData in
        connection(userData)?.streamClosed(id, errorCode: errorCode)
        return 0
    }

    /// nghttp2 asks for a response's next DATA bytes.
    static let readBody: nghttp2_data_source_read_callback = { _, id, buffer, length, flags, _, userData in
        guard let connection = connection(userData), let buffer, let flags, let stream = connection.stream(id) else {
            return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
        }
        return stream.readBody(into: buffer, length, flags: flags)
    }
}
