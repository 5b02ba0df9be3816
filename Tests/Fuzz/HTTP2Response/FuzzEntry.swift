// libFuzzer entry for tokenrelay's HTTP/2 upstream response mapping. Not part of the SwiftPM package:
// scripts/fuzz compiles this file with Sources/HTTPWire/*.swift and the CNghttp2 module using
// `swiftc -sanitize=fuzzer,address`.
//
// Each input is what an upstream server sends after its (empty, prepended) SETTINGS frame. It goes into an
// nghttp2 client session set up as HTTP2UpstreamSession sets up tokenrelay's (same options), after four
// requests were sent (streams 1 GET, 3 HEAD, 5 POST, 7 GET); every header block goes through
// HTTP2ResponseFields and every final head through HeadParser, as HTTP2ClientStream does. Beyond "never
// crashes" it checks what the client would be given:
// - a head HeadParser accepts has the `:status` nghttp2 passed, every field as it came and nothing else
//   but the framing line the mapping adds, and framing that matches the stream: content-length as sent,
//   none to HEAD/204/304, `content-length: 0` when HEADERS ended the stream, chunked otherwise;
// - the header block stays within the bound (256 KiB, as for tokenrelay's upstreams) while it is decoded;
// - no DATA before a final head, none for a response without a body, and a response that completes has
//   exactly the body its content-length announced (nghttp2's check, which the relay relies on);
// - trailers only after the head, ending the stream.
// Differential: the same fields sent by an HTTP/1.1 upstream (status line and field lines as they are,
// no framing added) must be accepted by tokenrelay's HTTP/1.1 path (HeadParser with the upstream limits)
// exactly when the mapped head is, and read alike (status, fields; framing when the fields say it).

import CNghttp2
#if canImport(Glibc)
import Glibc
#endif

/// As `HTTP2ClientConnection.Settings.maxHeadBytes` and the HTTP/1.1 upstream pool's head limit.
let maxHeadBytes = 256 * 1024
let upstreamLimits = HTTPWireLimits(maxHeadBytes: maxHeadBytes)

/// A failed invariant: says which (an -O build drops `precondition`'s message) and stops the run.
func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    guard !condition else { return }
    fputs("h2 response fuzz: \(message())\n", stderr)
    abort()
}

final class FuzzStream {
    let method: HTTPMethod
    var block = HTTP2ResponseFields(maxBytes: maxHeadBytes)
    var headDone = false
    var headAccepted = false
    /// The body length the accepted head announces (nil: chunked, read to END_STREAM).
    var expectedLength: Int?
    var received = 0
    var completed = false

    init(method: HTTPMethod) { self.method = method }
}

final class FuzzSession {
    var streams: [Int32: FuzzStream] = [:]
}

private func state(_ userData: UnsafeMutableRawPointer?) -> FuzzSession {
    Unmanaged<FuzzSession>.fromOpaque(userData!).takeUnretainedValue()
}

private func parse(_ bytes: inout [UInt8], _ method: HTTPMethod, _ limits: HTTPWireLimits) -> ResponseHead? {
    var parser = HeadParser(limits: limits)
    var head = ResponseHead()
    let complete = bytes.withUnsafeMutableBytes { buffer in (try? parser.parseResponse(buffer, requestMethod: method, into: &head)) ?? false }
    return complete ? head : nil
}

private func decimal(_ value: [UInt8]) -> Int? {
    guard !value.isEmpty, value.count < 19, value.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
    return value.reduce(0) { $0 * 10 + Int($1 - 0x30) }
}

/// The final head: mapped as HTTP2ClientStream maps it, checked, and compared with the HTTP/1.1 path.
private func finalHead(_ stream: FuzzStream, endStream: Bool) {
    let block = stream.block
    var mapped = block.http1Head(requestMethod: stream.method, endStream: endStream, reason: "X")
    var raw = Array("HTTP/1.1 \(block.status) X\r\n".utf8)
    for field in block.fields {
        raw.append(contentsOf: field.name)
        raw.append(contentsOf: ": ".utf8)
        raw.append(contentsOf: field.value)
        raw.append(contentsOf: "\r\n".utf8)
    }
    raw.append(contentsOf: "\r\n".utf8)
    // As HTTP2ClientStream reads it; the HTTP/1.1 path's limits without the head size (the block's own bound
    // is checked while it is decoded, and the HTTP/1.1 head has a status line besides).
    let mappedHead = parse(&mapped, stream.method, block.headLimits(upstreamLimits, headBytes: mapped.count))
    var rawLimits = upstreamLimits
    rawLimits.maxHeadBytes = max(rawLimits.maxHeadBytes, raw.count)
    let rawHead = parse(&raw, stream.method, rawLimits)
    check((mappedHead != nil) == (rawHead != nil),
                 "the HTTP/2 path \(mappedHead != nil ? "accepts" : "refuses") a head the HTTP/1.1 path \(rawHead != nil ? "accepts" : "refuses")")
    guard let head = mappedHead, let rawHead else { return }
    stream.headAccepted = true
    check(head.headLength == mapped.count, "the head ends early: \(head.headLength) of \(mapped.count) bytes")
    check(head.status == block.status && rawHead.status == block.status, "another status")
    check(head.fields.count == block.fields.count || head.fields.count == block.fields.count + 1, "fields added or lost")
    check(rawHead.fields.count == block.fields.count, "the HTTP/1.1 path reads other fields")
    for (index, field) in block.fields.enumerated() {
        check(Array(mapped[head.fields[index].name]) == field.name && Array(mapped[head.fields[index].value]) == field.value,
                     "field \(index) changed")
        check(Array(raw[rawHead.fields[index].name]) == field.name && Array(raw[rawHead.fields[index].value]) == field.value,
                     "field \(index) read otherwise by the HTTP/1.1 path")
    }
    let length = block.fields.last { $0.name.elementsEqual("content-length".utf8) }.flatMap { decimal($0.value) }
    let bodiless = stream.method == .head || block.status == 204 || block.status == 304
    switch head.semantics.framing {
    case .none:
        check(bodiless, "no body framing for a response that has one")
        stream.expectedLength = 0
    case .length(let n):
        check(!bodiless, "a body length for a response without a body")
        check(n == (length ?? 0) && (length != nil || endStream), "content-length \(n) not the one sent")
        if length != nil { check(rawHead.semantics.framing == .length(n), "the HTTP/1.1 path frames it otherwise") }
        stream.expectedLength = n
    case .chunked:
        check(!bodiless && length == nil && !endStream, "chunked where the fields or the stream say otherwise")
        stream.expectedLength = nil
    case .untilClose:
        check(false, "a response read until close")
    }
    if bodiless { check(rawHead.semantics.framing == .none, "the HTTP/1.1 path frames a bodiless response") }
}

private func complete(_ stream: FuzzStream) {
    guard stream.headAccepted, !stream.completed else { return }
    stream.completed = true
    if let expected = stream.expectedLength {
        check(stream.received == expected, "the body has \(stream.received) bytes, the head announced \(expected)")
    }
}

private let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
    guard let frame, let stream = state(userData).streams[frame.pointee.hd.stream_id] else { return 0 }
    stream.block.begin()
    return 0
}

private let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, let stream = state(userData).streams[frame.pointee.hd.stream_id] else { return 0 }
    let kept = stream.block.add(name: UnsafeRawBufferPointer(start: name, count: nameLength),
                                value: UnsafeRawBufferPointer(start: value, count: valueLength))
    check(stream.block.lineBytes <= maxHeadBytes || !kept, "a header block kept past its bound")
    return kept ? 0 : Int32(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
}

private let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
    guard let frame, let stream = state(userData).streams[frame.pointee.hd.stream_id] else { return 0 }
    let endStream = frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
    switch UInt32(frame.pointee.hd.type) {
    case NGHTTP2_HEADERS.rawValue:
        if stream.headDone {
            check(endStream, "trailers that do not end the stream")
            check(stream.block.status == -1, "a status in trailers")
            complete(stream)
            return 0
        }
        if stream.block.isInterim {
            check(!endStream, "an interim head ending the stream")
            return 0
        }
        stream.headDone = true
        finalHead(stream, endStream: endStream)
        if endStream { complete(stream) }
    case NGHTTP2_DATA.rawValue:
        if endStream { complete(stream) }
    default:
        break
    }
    return 0
}

private let onDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, id, _, length, userData in
    guard let stream = state(userData).streams[id] else { return 0 }
    check(stream.headDone, "DATA before the final head")
    check(!stream.completed, "DATA after the end")
    if stream.headAccepted, let expected = stream.expectedLength {
        check(stream.received + length <= expected, "more body than the head announced")
    }
    stream.received += length
    return 0
}

private let onStreamClose: nghttp2_on_stream_close_callback = { _, id, _, userData in
    state(userData).streams[id] = nil
    return 0
}

/// The request's fields as nghttp2 name-value pairs, valid during `body` (nghttp2 copies them).
private func withNameValues(_ pairs: [(String, String)], _ body: (UnsafeMutablePointer<nghttp2_nv>, Int) -> Int32) -> Int32 {
    var buffers: [UnsafeMutablePointer<UInt8>] = []
    defer { buffers.forEach { $0.deallocate() } }
    func copy(_ text: String) -> (UnsafeMutablePointer<UInt8>, Int) {
        let bytes = Array(text.utf8)
        let pointer = UnsafeMutablePointer<UInt8>.allocate(capacity: max(1, bytes.count))
        pointer.initialize(from: bytes, count: bytes.count)
        buffers.append(pointer)
        return (pointer, bytes.count)
    }
    var nva = pairs.map { pair -> nghttp2_nv in
        let (name, nameLength) = copy(pair.0), (value, valueLength) = copy(pair.1)
        return nghttp2_nv(name: name, value: value, namelen: nameLength, valuelen: valueLength, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
    }
    return nva.withUnsafeMutableBufferPointer { body($0.baseAddress!, $0.count) }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func http2ResponseFuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var callbacks: OpaquePointer?
    nghttp2_session_callbacks_new(&callbacks)
    defer { nghttp2_session_callbacks_del(callbacks) }
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
    nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
    var option: OpaquePointer?
    nghttp2_option_new(&option)
    defer { nghttp2_option_del(option) }
    nghttp2_option_set_no_auto_window_update(option, 1)
    nghttp2_option_set_max_continuations(option, 8)
    nghttp2_option_set_max_settings(option, 32)
    nghttp2_option_set_max_outbound_ack(option, 1000)
    nghttp2_option_set_peer_max_concurrent_streams(option, 100)
    let fuzzState = FuzzSession()
    var session: OpaquePointer?
    guard nghttp2_session_client_new2(&session, callbacks, Unmanaged.passUnretained(fuzzState).toOpaque(), option) == 0 else { return 0 }
    defer { nghttp2_session_del(session) }
    var entries = [
        nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
        nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 256 * 1024),
    ]
    _ = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count)
    for method in [HTTPMethod.get, .head, .post, .get] {
        let name: String = method == .head ? "HEAD" : method == .post ? "POST" : "GET"
        let pairs = [(":method", name), (":scheme", "http"), (":authority", "upstream"), (":path", "/")]
        let id = withNameValues(pairs) { nva, count in nghttp2_submit_request(session, nil, nva, count, nil, nil) }
        if id > 0 { fuzzState.streams[id] = FuzzStream(method: method) }
    }
    var out: UnsafePointer<UInt8>?
    var rounds = 0
    while rounds < 10_000, nghttp2_session_mem_send(session, &out) > 0 { rounds += 1 }
    // The server's connection preface (an empty SETTINGS frame), then the input.
    var input: [UInt8] = [0, 0, 0, 4, 0, 0, 0, 0, 0]
    input.append(contentsOf: UnsafeBufferPointer(start: data, count: size))
    _ = input.withUnsafeBufferPointer { nghttp2_session_mem_recv(session, $0.baseAddress, $0.count) }
    rounds = 0
    while rounds < 10_000, nghttp2_session_mem_send(session, &out) > 0 { rounds += 1 }
    withExtendedLifetime(fuzzState) {}
    return 0
}
