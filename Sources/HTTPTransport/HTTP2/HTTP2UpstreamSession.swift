import CNghttp2

/// The nghttp2 client session of an `HTTP2ClientConnection` (an HTTP/2 upstream): its options and the
/// callbacks that pass what nghttp2 parsed to the connection and its streams. The server side's
/// counterpart is `HTTP2Session`.
enum HTTP2UpstreamSession {
    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): what an upstream may send a stream
    /// whose client is slow before it has to wait.
    static let streamWindow = 256 * 1024

    /// Creates the session and queues our SETTINGS (after the client preface, which nghttp2 writes
    /// first). False if nghttp2 could not allocate it.
    static func make(_ session: inout OpaquePointer?, for connection: HTTP2ClientConnection, maxStreams: Int) -> Bool {
        // Response bodies wait for a slow client by flow control, and the flood limits apply (see
        // `HTTP2SessionConnection.makeSession`).
        let made = HTTP2ClientConnection.makeSession(&session, for: connection, register: { callbacks in
            nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
            nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
            nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
            nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
            nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
            nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks, onInvalidFrame)
        }, moreOptions: { option in
            // Until the server's SETTINGS say otherwise, no more streams than we would use anyway.
            nghttp2_option_set_peer_max_concurrent_streams(option, UInt32(clamping: max(1, maxStreams)))
        }, create: { nghttp2_session_client_new2($0, $1, $2, $3) })
        guard made, let session else { return false }
        // As on the server side, the connection's window is opened to what all streams' windows add up to, so
        // one stream whose client is slow never stalls the others.
        return HTTP2ClientConnection.submitSettings(session, [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: UInt32(streamWindow)),
        ], streams: maxStreams, streamWindow: streamWindow)
    }

    private static func connection(_ userData: UnsafeMutableRawPointer?) -> HTTP2ClientConnection? {
        HTTP2ClientConnection.from(userData)
    }

    private static let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
        guard let frame, let connection = connection(userData) else { return 0 }
        connection.stream(frame.pointee.hd.stream_id)?.beginHeaders()
        return 0
    }

    private static let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
        guard let frame, let connection = connection(userData),
              let stream = connection.stream(frame.pointee.hd.stream_id) else { return 0 }
        // Over the head limit: nghttp2 resets the stream, before HPACK references to one big table entry
        // can decode into megabytes.
        return stream.addField(name: UnsafeRawBufferPointer(start: name, count: nameLength),
                               value: UnsafeRawBufferPointer(start: value, count: valueLength))
            ? 0 : Int32(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
    }

    private static let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
        guard let frame, let connection = connection(userData) else { return 0 }
        let id = frame.pointee.hd.stream_id
        let endStream = frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        switch UInt32(frame.pointee.hd.type) {
        case NGHTTP2_HEADERS.rawValue:
            connection.stream(id)?.headersComplete(endStream: endStream)
        case NGHTTP2_DATA.rawValue:
            if endStream { connection.stream(id)?.receivedEnd() }
        case NGHTTP2_SETTINGS.rawValue:
            if frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 { connection.settingsReceived() }
        case NGHTTP2_GOAWAY.rawValue:
            connection.goAwayReceived(lastStreamID: frame.pointee.goaway.last_stream_id)
        default:
            break
        }
        return 0
    }

    private static let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, id, data, length, userData in
        HTTP2ClientConnection.onDataChunk(id, data, length, userData)
    }

    /// nghttp2 refused a frame of a stream (a response field or message that breaks RFC 9113, e.g. a
    /// connection-specific field or a content-length the DATA disagrees with) and resets that stream
    /// itself: its close must not read as the upstream's reset.
    private static let onInvalidFrame: nghttp2_on_invalid_frame_recv_callback = { _, frame, libErrorCode, userData in
        guard let frame, let connection = connection(userData) else { return 0 }
        connection.stream(frame.pointee.hd.stream_id)?.rejectedByUs(String(cString: nghttp2_strerror(libErrorCode)))
        return 0
    }

    private static let onStreamClose: nghttp2_on_stream_close_callback = { _, id, errorCode, userData in
        HTTP2ClientConnection.onStreamClose(id, errorCode, userData)
    }

    /// nghttp2 asks for a request's next DATA bytes.
    static let readBody: nghttp2_data_source_read_callback = { _, id, buffer, length, flags, _, userData in
        HTTP2ClientConnection.onReadBody(id, buffer, length, flags, userData)
    }
}
