import CNghttp2
import HTTPWire

/// What one HTTP/2 request stream reports, in order, on the loop's thread: body pieces, the body's end;
/// `streamCanSendMore` after `canSendMore` was false; `streamReset` when the client reset the stream (or
/// the connection closed) before its response was complete, after which nothing more is reported.
public protocol HTTP2ServerStreamHandler: AnyObject {
    func stream(_ stream: HTTP2ServerStream, receivedBody bytes: UnsafeRawBufferPointer)
    func streamReceivedEnd(_ stream: HTTP2ServerStream)
    func streamCanSendMore(_ stream: HTTP2ServerStream)
    func streamReset(_ stream: HTTP2ServerStream)
}

/// One request stream of an `HTTP2ServerConnection`, with the request and response calls of an HTTP/1.1
/// server connection's single request, so that the layers above handle both alike.
///
/// The head is handed over as a `ReceivedRequestHead`, HTTP/1.1 field lines made from the HTTP/2 fields
/// and parsed by HTTPWire: `:method` and `:path` become the request line, `:authority` the `Host`
/// field, split `cookie` fields one field joined by "; " (RFC 9113 §8.2.3); a body without
/// `content-length` is framed chunked. nghttp2 has refused what HTTP/2 forbids before this (connection-
/// specific fields, `te` other than `trailers`, CR, LF or NUL in a value, upper-case names, pseudo-headers
/// out of place or repeated, a `content-length` the DATA disagrees with), and HTTPWire's checks run on
/// the result as on any HTTP/1.1 head, so nothing reaches an HTTP/1.1 upstream that HTTP/1.1 could read
/// differently.
public final class HTTP2ServerStream {
    public let id: Int32
    public unowned let connection: HTTP2ServerConnection
    /// Held strongly until the stream is closed.
    public var handler: HTTP2ServerStreamHandler?
    public private(set) var head: ReceivedRequestHead?
    public var peer: PeerAddress { connection.peer }

    // The request head as it arrives.
    private var fields: HTTP2RequestFields
    private let maxHeadBytes: Int
    private var isHeadRequest = false

    // The request body.
    private var readingPaused = false
    private var heldInput: [UInt8] = []
    private var endHeld = false
    private var bodyEnded = false

    // The response.
    public private(set) var responseStarted = false
    private var responseComplete = false
    private var finishing = false
    private var outbound = HTTP2OutboundBytes()
    private var deferred = false
    private var trailers: [(name: String, value: String)] = []
    var wantsCanSendMore = false
    public private(set) var isClosed = false

    init(connection: HTTP2ServerConnection, id: Int32, maxHeadBytes: Int) {
        self.connection = connection
        self.id = id
        self.maxHeadBytes = maxHeadBytes
        fields = HTTP2RequestFields(maxBytes: maxHeadBytes)
    }

    // MARK: - The request

    func addField(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        fields.add(name: name, value: value)
    }

    /// Makes the head; false when the stream was answered here instead (431, 400).
    func completeHead(endStream: Bool) -> Bool {
        if fields.isOverLimit {
            respondLocally(status: 431, message: "request header fields larger than the limit")
            return false
        }
        var bytes = fields.http1Head(endStream: endStream)
        fields = HTTP2RequestFields(maxBytes: 0)   // kept no longer: the head is made
        var parser = HeadParser(limits: HTTPWireLimits(maxHeadBytes: max(maxHeadBytes, bytes.count)))
        var parsed = RequestHead()
        let outcome: Result<Bool, HTTPWireError> = bytes.withUnsafeMutableBytes { buffer in
            do throws(HTTPWireError) { return .success(try parser.parseRequest(buffer, into: &parsed)) } catch { return .failure(error) }
        }
        let complete: Bool
        switch outcome {
        case .success(let done): complete = done
        case .failure(let error):
            respondLocally(status: error.requestStatus == 431 ? 431 : 400, message: error.reason)
            return false
        }
        guard complete else {
            respondLocally(status: 400, message: "malformed request head")
            return false
        }
        isHeadRequest = parsed.method == .head
        head = ReceivedRequestHead(bytes: bytes, parsed: parsed)
        return true
    }

    /// The request's trailer fields (a HEADERS frame after the body), in the order received; bounded like
    /// the head (what is over `maxHeadBytes` is dropped).
    public private(set) var requestTrailers: [(name: String, value: String)] = []
    private var requestTrailerBytes = 0

    func addTrailer(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        requestTrailerBytes += name.count + value.count + 32
        guard requestTrailerBytes <= maxHeadBytes else { return }
        requestTrailers.append((String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self)))
    }

    func receivedBody(_ bytes: UnsafeRawBufferPointer) {
        // After the body's end, or with nobody to hand it to (answered here, or the exchange is over):
        // acknowledged and dropped, so that the connection's window stays open for the other streams.
        guard !bodyEnded, handler != nil else { return connection.consume(id, bytes.count) }
        if readingPaused {
            heldInput.append(contentsOf: bytes)
            return
        }
        handler?.stream(self, receivedBody: bytes)
        connection.consume(id, bytes.count)
    }

    func receivedEnd() {
        guard !bodyEnded else { return }
        if readingPaused || !heldInput.isEmpty {
            endHeld = true
            return
        }
        bodyEnded = true
        handler?.streamReceivedEnd(self)
    }

    /// Holds the request body back: the client's flow-control window is not reopened, so it stops
    /// sending once the window (256 KiB) is used.
    public func pauseReading() { readingPaused = true }

    public func resumeReading() {
        guard readingPaused else { return }
        readingPaused = false
        deliverHeld()
    }

    /// Body pieces that came while paused (or before a handler was set), then the end if it came too.
    public func deliverHeld() {
        guard !readingPaused, handler != nil, !isClosed else { return }
        if !heldInput.isEmpty {
            let held = heldInput
            heldInput = []
            held.withUnsafeBytes { handler?.stream(self, receivedBody: $0) }
            connection.consume(id, held.count)
        }
        if endHeld && !readingPaused && heldInput.isEmpty && !bodyEnded {
            endHeld = false
            bodyEnded = true
            handler?.streamReceivedEnd(self)
        }
    }

    public var isReadingPaused: Bool { readingPaused }

    // MARK: - The response

    /// Response bytes buffered for this stream are under the limit, and the socket has room.
    public var canSendMore: Bool {
        let ok = outbound.count < connection.settings.streamBufferLimit && connection.socketHasRoom
        if !ok { wantsCanSendMore = true }
        return ok
    }

    /// A `100 Continue` (HTTP/2 carries it as a HEADERS frame of its own).
    public func sendContinue() {
        guard !responseStarted, !isClosed else { return }
        submitHead(HTTP2FieldList(status: 100), informational: true, endStream: false, provider: false)
    }

    /// Starts the response: `fields` are written as HTTP/1.1 field lines (see `HTTPFieldBlock`) and sent
    /// lower-cased, without the connection-specific ones; `body` says whether DATA follows (`.known(n)`
    /// adds `content-length`). The reason phrase does not exist in HTTP/2.
    public func startResponse(status: Int, reason: UnsafeRawBufferPointer, body: BodyLength, fields: (inout HTTPFieldBlock) -> Void) {
        guard !responseStarted, !isClosed else { return }
        var block = HTTPFieldBlock()
        fields(&block)
        var list = HTTP2FieldList(status: status)
        list.appendLines(block.buffer.bytes)
        var hasBody = true
        switch body {
        case .none: hasBody = false
        case .known(let n):
            list.append(name: "content-length", decimal: n)
            hasBody = n > 0
        case .unknown: break
        }
        if isHeadRequest || status == 204 || status == 304 { hasBody = false }
        submitHead(list, informational: false, endStream: !hasBody, provider: hasBody)
        if !hasBody { responseComplete = true }
    }

    public func startResponse(_ response: HTTPResponseHead, body: BodyLength) {
        startResponse(status: response.status, reason: UnsafeRawBufferPointer(start: nil, count: 0), body: body) { block in
            for field in response.fields { block.append(name: field.name, value: field.value) }
        }
    }

    public func sendBody(_ bytes: UnsafeRawBufferPointer) {
        guard responseStarted, !responseComplete, !finishing, !isClosed, bytes.count > 0 else { return }
        outbound.append(bytes)
        resume()
    }

    public func sendBody(_ bytes: [UInt8]) { bytes.withUnsafeBytes { sendBody($0) } }

    /// Ends the response body; `trailers`, if any, go in a HEADERS frame after the last DATA.
    public func finishResponse(trailers: [(name: String, value: String)] = []) {
        guard responseStarted, !responseComplete, !finishing, !isClosed else { return }
        self.trailers = trailers
        finishing = true
        resume()
    }

    public func respond(status: Int, reason: UnsafeRawBufferPointer, body: [UInt8], fields: (inout HTTPFieldBlock) -> Void) {
        startResponse(status: status, reason: reason, body: .known(body.count), fields: fields)
        sendBody(body)
        finishResponse()
    }

    public func respond(_ response: HTTPResponseHead, body: [UInt8]) {
        startResponse(response, body: .known(body.count))
        sendBody(body)
        finishResponse()
    }

    /// Resets the stream (RST_STREAM INTERNAL_ERROR): a response that cannot be completed.
    public func reset() {
        guard !isClosed else { return }
        connection.submit { session in
            _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, UInt32(NGHTTP2_INTERNAL_ERROR.rawValue))
        }
    }

    var hasUnsentBody: Bool { !outbound.isEmpty }

    private func respondLocally(status: Int, message: String) {
        let body = Array("\(message)\n".utf8)
        startResponse(status: status, reason: UnsafeRawBufferPointer(start: nil, count: 0), body: .known(body.count)) { block in
            block.append(name: "Content-Type", value: "text/plain")
        }
        sendBody(body)
        finishResponse()
    }

    private func resume() {
        guard deferred else { return connection.scheduleFlush() }
        deferred = false
        connection.submit { session in _ = nghttp2_session_resume_data(session, id) }
    }

    private func submitHead(_ list: HTTP2FieldList, informational: Bool, endStream: Bool, provider: Bool) {
        if !informational { responseStarted = true }
        connection.submit { session in
            list.withNameValues { nva, count in
                if informational {
                    _ = nghttp2_submit_headers(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, nil, nva, count, nil)
                } else if provider {
                    var source = nghttp2_data_provider()
                    source.read_callback = HTTP2Session.readBody
                    _ = nghttp2_submit_response(session, id, nva, count, &source)
                } else {
                    _ = nghttp2_submit_response(session, id, nva, count, nil)
                }
            }
        }
    }

    /// nghttp2 asks for up to `length` DATA bytes: what is buffered, the end (with trailers after it), or
    /// "deferred" until `sendBody` or `finishResponse` resumes the stream.
    func readBody(into buffer: UnsafeMutablePointer<UInt8>, _ length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        let n = outbound.take(into: buffer, length)
        if outbound.isEmpty && finishing {
            flags.pointee |= UInt32(NGHTTP2_DATA_FLAG_EOF.rawValue)
            responseComplete = true
            if !trailers.isEmpty {
                flags.pointee |= UInt32(NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue)
                var list = HTTP2FieldList()
                for field in trailers { list.append(name: field.name, value: field.value) }
                if let session = sessionPointer {
                    list.withNameValues { nva, count in _ = nghttp2_submit_trailer(session, id, nva, count) }
                }
            }
            return n
        }
        if n == 0 {
            deferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
        return n
    }

    var sessionPointer: OpaquePointer? { connection.sessionForStreams }

    /// The stream is closed (both ends done, or reset): an unfinished response means the client is gone.
    func closed(errorCode: UInt32) {
        guard !isClosed else { return }
        isClosed = true
        let complete = responseComplete && outbound.isEmpty
        let told = handler
        handler = nil
        if !complete { told?.streamReset(self) }
    }
}
