import CNghttp2

/// What the nghttp2 sessions of both sides (`HTTP2Session` for the proxied port, `HTTP2UpstreamSession` for an
/// HTTP/2 upstream) set up and handle alike: the options, our SETTINGS with the connection window, and the
/// callbacks that only find a stream and hand it bytes (DATA in, DATA out, a stream's close). Each side keeps
/// the callbacks that differ (heads, frames) in its own file.
protocol HTTP2SessionConnection: AnyObject {
    associatedtype Stream: HTTP2SessionStream
    func stream(_ id: Int32) -> Stream?
    /// Gives back the flow-control window of `count` bytes that no stream takes (answered or reset already).
    func consume(_ id: Int32, _ count: Int)
    func streamClosed(_ id: Int32, errorCode: UInt32)
}

/// What the shared callbacks hand a stream of either side.
protocol HTTP2SessionStream: AnyObject {
    func receivedBody(_ bytes: UnsafeRawBufferPointer)
    func readBody(into buffer: UnsafeMutablePointer<UInt8>, _ length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int
}

extension HTTP2SessionConnection {
    /// Creates `session` with the callbacks `register` sets, the options both sides use and `moreOptions`;
    /// `create` is nghttp2_session_server_new2 or nghttp2_session_client_new2. The connection is the callbacks'
    /// user data, not retained: it owns the session and deletes it before it goes.
    static func makeSession(_ session: inout OpaquePointer?, for connection: Self, register: (OpaquePointer) -> Void,
                            moreOptions: (OpaquePointer) -> Void,
                            create: (UnsafeMutablePointer<OpaquePointer?>, OpaquePointer, UnsafeMutableRawPointer, OpaquePointer) -> Int32) -> Bool {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return false }
        defer { nghttp2_session_callbacks_del(callbacks) }
        register(callbacks)

        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { return false }
        defer { nghttp2_option_del(option) }
        // Received bodies are acknowledged (WINDOW_UPDATE) only once they were handed on (or dropped): a stream
        // whose other side is slow stops its peer by flow control instead of being buffered without bound.
        nghttp2_option_set_no_auto_window_update(option, 1)
        // CONTINUATION flood: at most 8 CONTINUATION frames after a HEADERS (the header list limit is ours).
        nghttp2_option_set_max_continuations(option, 8)
        // SETTINGS with many entries, and SETTINGS or PING floods whose ACKs the peer never reads: at most 32
        // entries a frame, 1000 queued ACKs, past which the connection ends.
        nghttp2_option_set_max_settings(option, 32)
        nghttp2_option_set_max_outbound_ack(option, 1000)
        moreOptions(option)

        let context = Unmanaged.passUnretained(connection).toOpaque()
        return create(&session, callbacks, context, option) == 0 && session != nil
    }

    /// Queues our SETTINGS and opens the connection's own receive window to what all streams' windows add up
    /// to: it starts at 65,535 bytes whatever SETTINGS say (they size streams' windows only), so one stream
    /// whose bytes are held (waiting for a refresh, or for a slow other side) would use it up and stall every
    /// other stream on the connection. Opened so, a held stream can only ever stop itself (docs/nghttp2.md).
    static func submitSettings(_ session: OpaquePointer, _ entries: [nghttp2_settings_entry], streams: Int, streamWindow: Int) -> Bool {
        var entries = entries
        guard nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count) == 0 else { return false }
        let connectionWindow = Int32(clamping: max(1, streams) &* streamWindow)
        return nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, connectionWindow) == 0
    }

    /// The connection a callback's user data points at.
    static func from(_ userData: UnsafeMutableRawPointer?) -> Self? {
        guard let userData else { return nil }
        return Unmanaged<Self>.fromOpaque(userData).takeUnretainedValue()
    }

    /// DATA for stream `id`: to its stream, or (a stream already answered or reset) acknowledged and dropped.
    static func onDataChunk(_ id: Int32, _ data: UnsafePointer<UInt8>?, _ length: Int, _ userData: UnsafeMutableRawPointer?) -> Int32 {
        guard let connection = from(userData) else { return 0 }
        guard let stream = connection.stream(id) else {
            connection.consume(id, length)
            return 0
        }
        stream.receivedBody(UnsafeRawBufferPointer(start: data, count: length))
        return 0
    }

    static func onStreamClose(_ id: Int32, _ errorCode: UInt32, _ userData: UnsafeMutableRawPointer?) -> Int32 {
        from(userData)?.streamClosed(id, errorCode: errorCode)
        return 0
    }

    /// nghttp2 asks for stream `id`'s next DATA bytes.
    static func onReadBody(_ id: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int, _ flags: UnsafeMutablePointer<UInt32>?,
                         _ userData: UnsafeMutableRawPointer?) -> Int {
        guard let connection = from(userData), let buffer, let flags, let stream = connection.stream(id) else {
            return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
        }
        return stream.readBody(into: buffer, length, flags: flags)
    }
}

extension HTTP2ServerConnection: HTTP2SessionConnection {}
extension HTTP2ServerStream: HTTP2SessionStream {}
extension HTTP2ClientConnection: HTTP2SessionConnection {}
extension HTTP2ClientStream: HTTP2SessionStream {}
