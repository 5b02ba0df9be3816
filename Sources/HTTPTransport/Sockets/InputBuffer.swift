import Glibc

/// A fixed-capacity byte buffer: the socket reads into the free space at its end, the parser consumes
/// from its start. Its memory is taken from the loop's pool only while it holds bytes, so an idle
/// keep-alive connection costs no buffer (10,000 idle clients must not mean 10,000 × 64 KiB).
final class InputBuffer {
    let capacity: Int
    private let pool: BufferPool
    private var base: UnsafeMutableRawPointer?
    private(set) var start = 0
    private(set) var endOffset = 0

    init(capacity: Int, pool: BufferPool) {
        self.capacity = capacity
        self.pool = pool
    }

    /// Also with unconsumed bytes (a connection closed after bytes it will never parse): the storage
    /// goes back to the pool either way, or each such close would leak a buffer.
    deinit {
        if let base { pool.give(base, capacity) }
    }

    var count: Int { endOffset - start }
    var spaceAtEnd: Int { capacity - endOffset }

    /// Where the next read goes (takes storage from the pool if the buffer has none).
    var end: UnsafeMutableRawPointer {
        if base == nil { base = pool.take(capacity) }
        return base! + endOffset
    }

    /// The unconsumed bytes, writable (the head parser rewrites obsolete line folding in place).
    var unconsumed: UnsafeMutableRawBufferPointer {
        guard let base else { return UnsafeMutableRawBufferPointer(start: nil, count: 0) }
        return UnsafeMutableRawBufferPointer(start: base + start, count: count)
    }

    func didFill(_ n: Int) { endOffset += n }

    func consume(_ n: Int) {
        start += min(n, count)
        if start == endOffset {
            start = 0
            endOffset = 0
        }
    }

    /// Gives the memory back while empty.
    func releaseStorage() {
        guard count == 0, let base else { return }
        pool.give(base, capacity)
        self.base = nil
    }

    /// Moves the unconsumed bytes to the front to make room at the end.
    func compact() {
        guard start > 0, let base else { return }
        let n = count
        if n > 0 { memmove(base, base + start, n) }
        start = 0
        endOffset = n
    }
}
