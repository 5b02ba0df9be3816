import Foundation

/// A fresh, unique directory under the system temp dir for one test's config, token file and logs.
/// Unique per call so tests running in parallel processes never share state.
func makeTemporaryDirectory(prefix: String = "tokenrelay-test") -> URL {
    let url = URL(fileURLWithPath: NSTemporaryDirectory(), isDirectory: true)
        .appendingPathComponent("\(prefix)-\(getpid())-\(UUID().uuidString)", isDirectory: true)
    // Failing to create a temp dir means the machine is broken; crash loudly rather than mislead.
    try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}

/// Writes a token file `{"access_token":..,"refresh_token":..,"expires_at":..}` with POSIX `mode`.
///
/// `expiresAt` is written as RFC 3339 UTC (`2026-11-21T10:00:00Z`, the product's token-file
/// format) and omitted when nil. The mode is applied explicitly (chmod after writing) because the
/// umask would otherwise decide it, and the product checks token-file permissions (0600 by default).
func writeTokenFile(at url: URL, access: String, refresh: String, expiresAt: Date? = nil,
                    mode: mode_t = 0o600) throws {
    var object: [String: Any] = ["access_token": access, "refresh_token": refresh]
    if let expiresAt {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        object["expires_at"] = formatter.string(from: expiresAt)
    }
    let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
    try data.write(to: url)
    guard chmod(url.path, mode) == 0 else { throw TestSupportError(errnoContext: "chmod \(url.path)") }
}
