import CLibevent

/// How far a client's request head has arrived: when its first byte came, whether its end (an empty
/// line) has been seen, and what evhttp's parser would hide (its true size, a NUL inside it). Scans only the bytes as they arrive, so a head trickled one byte at a
/// time costs one pass, never a search of the whole buffer per byte.
struct HeadProgress {
    let startedAt: Double
    private(set) var isComplete = false
    /// Bytes of the head so far, request line and line endings included (evhttp counts neither).
    private(set) var length = 0
    /// A NUL byte, which evhttp's C strings would silently cut the field at.
    private(set) var containsNUL = false
    /// The last bytes seen, enough to find CR LF CR LF or LF LF across reads.
    private var tail: UInt32 = 0

    init(startedAt: Double) {
        self.startedAt = startedAt
    }

    /// Scans `count` bytes of `buffer` from `offset`, stopping at the end of the head.
    mutating func scan(_ buffer: OpaquePointer, offset: Int, count: Int) {
        guard count > 0, !isComplete else { return }
        var position = evbuffer_ptr()
        guard evbuffer_ptr_set(buffer, &position, offset, EVBUFFER_PTR_SET) == 0 else { return }
        var chunks = [iovec](repeating: iovec(), count: 8)
        var remaining = count
        while remaining > 0 && !isComplete {
            let filled = Int(evbuffer_peek(buffer, remaining, &position, &chunks, Int32(chunks.count)))
            guard filled > 0 else { return }
            var consumed = 0
            for chunk in chunks.prefix(min(filled, chunks.count)) where remaining > 0 && !isComplete {
                let length = min(chunk.iov_len, remaining)
                guard let base = chunk.iov_base?.assumingMemoryBound(to: UInt8.self) else { continue }
                for index in 0..<length {
                    feed(base[index])
                    if isComplete { break }
                }
                remaining -= length
                consumed += length
            }
            guard remaining > 0, !isComplete, consumed > 0,
                  evbuffer_ptr_set(buffer, &position, consumed, EVBUFFER_PTR_ADD) == 0 else { return }
        }
    }

    private mutating func feed(_ byte: UInt8) {
        length += 1
        if byte == 0 { containsNUL = true }
        tail = tail << 8 | UInt32(byte)
        // An empty line ends the head: CR LF CR LF, or with bare LF line ends (RFC 9112 §2.2 lets a
        // recipient accept them, and evhttp does) LF LF or LF CR LF.
        if tail == 0x0D0A_0D0A || tail & 0xFFFF == 0x0A0A || tail & 0xFF_FFFF == 0x0A_0D0A { isComplete = true }
    }
}
