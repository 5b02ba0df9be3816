import Glibc

/// Seconds on the monotonic clock (vDSO: no system call), for "quiet since" bookkeeping that must not
/// jump with the wall clock. Deadlines are checked lazily when a timer fires, so a read only stores a
/// timestamp instead of rescheduling a timer.
func monotonicSeconds() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1_000_000_000
}

/// A timeval for libevent from seconds, clamped (0 ... 30 days): a limit from configuration must not
/// trap or wrap.
func clampedTimeval(_ seconds: Double) -> timeval {
    let clamped = seconds.isFinite ? min(max(seconds, 0), 30 * 24 * 3600) : 0
    let whole = clamped.rounded(.down)
    return timeval(tv_sec: Int(whole), tv_usec: Int((clamped - whole) * 1_000_000))
}
