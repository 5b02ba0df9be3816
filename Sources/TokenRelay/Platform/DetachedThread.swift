import Glibc

/// A plain POSIX thread for one blocking job (an fsync'd write, a contended flock): what
/// `Thread.detachNewThread` did, without Foundation.
enum DetachedThread {
    static func start(_ body: @escaping @Sendable () -> Void) {
        let box = Unmanaged.passRetained(Body(body))
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { raw in
            let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
            body.run()
            return nil
        }, box.toOpaque())
        guard result == 0 else {
            box.release()
            // Without a thread the job cannot run off the loop; running it here keeps its result (and
            // whoever waits for it) from being lost. Only reachable when the process is out of threads.
            body()
            return
        }
        pthread_detach(thread)
    }

    /// Blocks the calling thread (never the event loop's) for `seconds`, resuming after signals.
    static func sleep(seconds: Double) {
        guard seconds > 0, seconds.isFinite else { return }
        let clamped = min(seconds, 86_400)
        var request = timespec(tv_sec: Int(clamped), tv_nsec: Int((clamped - clamped.rounded(.down)) * 1_000_000_000))
        var remaining = timespec()
        while nanosleep(&request, &remaining) != 0, errno == EINTR { request = remaining }
    }

    private final class Body: @unchecked Sendable {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }
}
