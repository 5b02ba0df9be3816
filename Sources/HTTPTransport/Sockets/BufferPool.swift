/// Read buffers of one loop, reused: a connection holds one only while it has unconsumed input, and a
/// bounded number of free ones are kept so that busy connections do not allocate per read. Buffers of the
/// standard size and of one other size (upstream connections read into larger ones, room for a larger
/// head) are kept; fewer of the larger.
final class BufferPool {
    let size: Int
    private var free: [UnsafeMutableRawPointer] = []
    private let maxFree: Int
    private var otherSize = 0
    private var freeOther: [UnsafeMutableRawPointer] = []
    private let maxFreeOther = 8

    /// Buffers taken since the owner last asked (`takenSinceLastAsked`): how it tells a quiet loop from a busy one.
    private var taken = 0
    /// Called when a buffer is kept free while none was: the owner schedules `releaseFree` for a quiet moment.
    var onFirstKept: (() -> Void)?

    init(size: Int = 64 * 1024, maxFree: Int = 64) {
        self.size = size
        self.maxFree = maxFree
    }

    var keepsFreeBuffers: Bool { !free.isEmpty || !freeOther.isEmpty }

    func takenSinceLastAsked() -> Int {
        defer { taken = 0 }
        return taken
    }

    /// Gives every kept buffer back to malloc (after a burst, so that a quiet relay does not keep its peak).
    func releaseFree() {
        for buffer in free { buffer.deallocate() }
        for buffer in freeOther { buffer.deallocate() }
        free.removeAll()
        freeOther.removeAll()
    }

    func take(_ capacity: Int) -> UnsafeMutableRawPointer {
        taken &+= 1
        if capacity == size, let buffer = free.popLast() { return buffer }
        if capacity == otherSize, let buffer = freeOther.popLast() { return buffer }
        return UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 16)
    }

    func give(_ buffer: UnsafeMutableRawPointer, _ capacity: Int) {
        if !keepsFreeBuffers { onFirstKept?() }
        if capacity == size && free.count < maxFree {
            free.append(buffer)
            return
        }
        if otherSize == 0 && capacity != size { otherSize = capacity }
        if capacity == otherSize && freeOther.count < maxFreeOther {
            freeOther.append(buffer)
        } else {
            buffer.deallocate()
        }
    }

    deinit {
        for buffer in free { buffer.deallocate() }
        for buffer in freeOther { buffer.deallocate() }
    }
}
