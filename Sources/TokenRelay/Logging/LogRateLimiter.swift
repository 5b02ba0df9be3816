/// Lets a repeated log line through at most once per interval per key, counting what it held back.
///
/// Under a flood (a connection storm, a load spike answered with 503s) a line per event would bury
/// everything else and cost more than the events; the metrics count every event, the log says that it
/// happens, why, and how often since the last line.
struct LogRateLimiter {
    let interval: Double
    private var lastLine: [String: Double] = [:]
    private var heldBack: [String: Int] = [:]

    init(interval: Double) {
        self.interval = interval
    }

    /// Whether a line for `key` may be written at `now` (monotonic seconds), and how many were held back
    /// since the last one.
    mutating func admit(_ key: String, now: Double) -> (allowed: Bool, heldBack: Int) {
        guard now - (lastLine[key] ?? -.infinity) >= interval else {
            heldBack[key, default: 0] += 1
            return (false, 0)
        }
        lastLine[key] = now
        return (true, heldBack.removeValue(forKey: key) ?? 0)
    }
}
