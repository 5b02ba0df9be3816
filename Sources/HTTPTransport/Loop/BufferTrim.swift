import CTransportSocket

/// Hands the read buffers a burst left in the loop's pool back to the system once the loop has been quiet
/// for `quietSeconds`: a relay that served a burst and then holds thousands of idle keep-alive clients
/// should not keep the burst's peak (bench/README.md, "Idle clients"). Busy loops are left alone: the check
/// re-arms while buffers are still being taken, so a steady load never frees and reallocates its buffers.
final class BufferTrim {
    private let quietSeconds: Double
    private unowned let pool: BufferPool
    private var timer: TransportTimer?

    init(loop: TransportLoop, pool: BufferPool, quietSeconds: Double = 3) {
        self.pool = pool
        self.quietSeconds = quietSeconds
        timer = TransportTimer(loop: loop) { [unowned self] in self.check() }
    }

    /// The pool kept a buffer while it held none: look again after a quiet spell.
    func poolStartedKeeping() {
        guard let timer, !timer.isScheduled else { return }
        _ = pool.takenSinceLastAsked()
        timer.schedule(after: quietSeconds)
    }

    private func check() {
        guard pool.keepsFreeBuffers else { return }
        if pool.takenSinceLastAsked() > 0 {
            timer?.schedule(after: quietSeconds)
            return
        }
        pool.releaseFree()
        // Freed 64 KiB blocks sit inside malloc's heap, which keeps their pages resident; malloc_trim
        // returns every whole free page to the kernel.
        transport_release_free_memory()
    }
}
