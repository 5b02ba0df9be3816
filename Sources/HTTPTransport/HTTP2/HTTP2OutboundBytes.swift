/// A stream's DATA bytes waiting for nghttp2 to ask for them (`nghttp2_data_source_read_callback`): appended
/// as the body arrives, copied out from the front as frames are built. The consumed front is dropped when it
/// is half the buffer (on append) or all of it (on take), so the buffer neither grows with what was sent nor
/// moves its bytes on every frame. Shared by the server side's response streams and the client side's
/// request streams.
struct HTTP2OutboundBytes {
    private var bytes: [UInt8] = []
    private var start = 0

    /// Bytes not yet handed to nghttp2.
    var count: Int { bytes.count - start }
    var isEmpty: Bool { count == 0 }

    mutating func append(_ more: UnsafeRawBufferPointer) {
        if start > 0 && start >= bytes.count / 2 {
            bytes.removeFirst(start)
            start = 0
        }
        bytes.append(contentsOf: more)
    }

    /// Copies up to `length` bytes into `buffer` and returns how many.
    mutating func take(into buffer: UnsafeMutablePointer<UInt8>, _ length: Int) -> Int {
        let n = min(length, count)
        guard n > 0 else { return 0 }
        bytes.withUnsafeBytes { stored in
            UnsafeMutableRawPointer(buffer).copyMemory(from: stored.baseAddress! + start, byteCount: n)
        }
        start += n
        if start == bytes.count {
            bytes.removeAll(keepingCapacity: true)
            start = 0
        }
        return n
    }
}
