/// The two path operations the token-file writers need, with the results `NSString`'s
/// `deletingLastPathComponent` / `lastPathComponent` gave (trailing slashes ignored, the root kept).
enum FilePath {
    /// `/a/b` → `/a`, `/a` → `/`, `a` → `` (empty: the current directory), `a/b/` → `a`.
    static func parent(of path: String) -> String {
        let trimmed = withoutTrailingSlashes(path)
        guard trimmed != "/" else { return "/" }
        guard let slash = trimmed.lastIndex(of: "/") else { return "" }
        let head = withoutTrailingSlashes(String(trimmed[..<slash]))
        return head.isEmpty ? "/" : head
    }

    /// `/a/b` → `b`, `a/b/` → `b`, `/` → `/`.
    static func lastComponent(of path: String) -> String {
        let trimmed = withoutTrailingSlashes(path)
        guard trimmed != "/" else { return "/" }
        guard let slash = trimmed.lastIndex(of: "/") else { return trimmed }
        return String(trimmed[trimmed.index(after: slash)...])
    }

    private static func withoutTrailingSlashes(_ path: String) -> String {
        var result = Substring(path)
        while result.count > 1, result.hasSuffix("/") { result = result.dropLast() }
        return String(result)
    }
}
