import Foundation

/// Polls `condition` every `interval` seconds until it returns true or `timeout` elapses.
///
/// Tests must never use a fixed sleep as synchronisation: it is either too short on a loaded CI
/// machine (flaky) or too long everywhere else (slow). Polling against a deadline is both fast and
/// robust, and the bounded deadline guarantees that a broken product fails the test instead of
/// hanging it. Returns whether the condition became true in time.
@discardableResult
func waitUntil(timeout: Double, interval: Double = 0.015, _ condition: () -> Bool) -> Bool {
    let deadline = Date(timeIntervalSinceNow: timeout)
    while true {
        if condition() { return true }
        if Date() >= deadline { return false }
        usleep(useconds_t(max(0.001, min(interval, 0.1)) * 1_000_000))
    }
}
