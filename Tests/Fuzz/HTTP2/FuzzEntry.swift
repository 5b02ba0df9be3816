// libFuzzer entry for tokenrelay's HTTP/2 request mapping. Not part of the SwiftPM package: scripts/fuzz
// compiles this file with Sources/HTTPWire/*.swift and the CNghttp2 module using
// `swiftc -sanitize=fuzzer,address`.
//
// Each input is a client's frames after the connection preface. They go through an nghttp2 server session
// set up as HTTP2Session sets up tokenrelay's (same options), every complete request head through
// HTTP2RequestFields and HeadParser, as HTTP2ServerStream does. Beyond "never crashes", it checks what the
// HTTP/1.1 upstream would see: a head HeadParser accepts is read to its last byte (nothing in a field
// could end it early or add a field), with the method and target the HTTP/2 request named, and framed as
// the stream is (no body after END_STREAM on HEADERS, unless a content-length of 0 says so).

import CNghttp2
#if canImport(Glibc)
import Glibc
#endif

final class FuzzSession {
    var requests: [Int32: HTTP2RequestFields] = [:]
    var heads = 0
}

private func state(_ userData: UnsafeMutableRawPointer?) -> FuzzSession {
    Unmanaged<FuzzSession>.fromOpaque(userData!).takeUnretainedValue()
}

private func isRequestHeaders(_ frame: UnsafePointer<nghttp2_frame>) -> Bool {
    frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) && frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST
}

private let onBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
    guard let frame, isRequestHeaders(frame) else { return 0 }
    state(userData).requests[frame.pointee.hd.stream_id] = HTTP2RequestFields(maxBytes: 16 * 1024)
    return 0
}

private let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, isRequestHeaders(frame) else { return 0 }
    state(userData).requests[frame.pointee.hd.stream_id]?.add(name: UnsafeRawBufferPointer(start: name, count: nameLength),
                                                               value: UnsafeRawBufferPointer(start: value, count: valueLength))
    return 0
}

private let onFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
    guard let frame, isRequestHeaders(frame) else { return 0 }
    let session = state(userData)
    guard let fields = session.requests.removeValue(forKey: frame.pointee.hd.stream_id), !fields.isOverLimit else { return 0 }
    let endStream = frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
    var bytes = fields.http1Head(endStream: endStream)
    var parser = HeadParser(limits: HTTPWireLimits(maxHeadBytes: max(16 * 1024, bytes.count)))
    var head = RequestHead()
    let count = bytes.count
    let complete = bytes.withUnsafeMutableBytes { buffer in (try? parser.parseRequest(buffer, into: &head)) ?? false }
    guard complete else { return 0 }
    session.heads += 1
    precondition(head.headLength == count, "the head ends early: \(head.headLength) of \(count) bytes")
    precondition(Array(bytes[head.methodBytes]) == fields.method, "another method")
    let target = fields.path.isEmpty ? fields.authority : fields.path
    precondition(Array(bytes[head.target]) == target, "another target")
    if endStream {
        switch head.semantics.framing {
        case .none, .length(0): break
        default: preconditionFailure("a body after END_STREAM: \(head.semantics.framing)")
        }
    }
    return 0
}

private let onStreamClose: nghttp2_on_stream_close_callback = { _, id, _, userData in
    state(userData).requests[id] = nil
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func http2FuzzOneInput(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var callbacks: OpaquePointer?
    nghttp2_session_callbacks_new(&callbacks)
    defer { nghttp2_session_callbacks_del(callbacks) }
    nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, onBeginHeaders)
    nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
    nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
    var option: OpaquePointer?
    nghttp2_option_new(&option)
    defer { nghttp2_option_del(option) }
    nghttp2_option_set_no_auto_window_update(option, 1)
    nghttp2_option_set_max_continuations(option, 8)
    nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33)
    nghttp2_option_set_max_settings(option, 32)
    nghttp2_option_set_max_outbound_ack(option, 1000)
    let fuzzState = FuzzSession()
    var session: OpaquePointer?
    guard nghttp2_session_server_new2(&session, callbacks, Unmanaged.passUnretained(fuzzState).toOpaque(), option) == 0 else { return 0 }
    defer { nghttp2_session_del(session) }
    var input = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
    input.append(contentsOf: UnsafeBufferPointer(start: data, count: size))
    _ = input.withUnsafeBufferPointer { nghttp2_session_mem_recv(session, $0.baseAddress, $0.count) }
    var out: UnsafePointer<UInt8>?
    var rounds = 0
    while rounds < 10_000, nghttp2_session_mem_send(session, &out) > 0 { rounds += 1 }
    withExtendedLifetime(fuzzState) {}
    return 0
}
