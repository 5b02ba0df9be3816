import FoundationEssentials

/// `Retry-After` from the token endpoint (RFC 9110 §10.2.3): delay-seconds or an HTTP-date, clamped at
/// the edge to `0...maximumSeconds`, so a hostile or broken server can neither pause refreshing for a
/// year nor make the arithmetic that follows trap.
enum RetryAfter {
    /// Longer waits are cut to this: a server asking for more is treated as asking for a minute.
    static let maximumSeconds = 60.0

    static func seconds(from value: String?, now: Date) -> Double? {
        guard let text = value?.trimmingWhitespace(), !text.isEmpty else { return nil }
        if text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            // Any number of digits: Double never traps, and the clamp below bounds it.
            guard let seconds = Double(text) else { return nil }
            return clamp(seconds)
        }
        guard let date = HTTPDate.parse(text) else { return nil }
        return clamp(date.timeIntervalSince(now))
    }

    private static func clamp(_ seconds: Double) -> Double? {
        guard seconds.isFinite else { return maximumSeconds }
        return min(max(seconds, 0), maximumSeconds)
    }
}
