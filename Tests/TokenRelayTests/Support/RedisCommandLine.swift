import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What `RedisServerProcess` and `SentinelProcess` both do with their redis-server: ask it with redis-cli,
/// and stop it by its PID.

/// One redis-cli command; `connection` says how to reach the server (`-s path`, or `-h`/`-p` and a login).
/// Its output without the trailing newline.
func redisCLI(_ connection: [String], _ arguments: [String]) throws -> String {
    let result = try runTool("redis-cli", connection + arguments, timeout: 10)
    guard result.exitCode == 0 else { throw TestSupportError("redis-cli \(arguments.first ?? ""): \(result.stderr)") }
    return result.stdout.trimmingCharacters(in: .newlines)
}

/// SIGTERM (redis-server flushes an AOF on the way out), SIGKILL if it is still running after 5 s.
func terminateRedisProcess(_ process: Process) {
    kill(process.processIdentifier, SIGTERM)
    if !waitUntil(timeout: 5, { !process.isRunning }) {
        kill(process.processIdentifier, SIGKILL)
        waitUntil(timeout: 5) { !process.isRunning }
    }
}
