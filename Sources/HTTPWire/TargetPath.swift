/// Path handling for origin-form request targets ("/path?query"), for decisions a proxy makes on the path
/// (which prefix it falls under, where it lands under the upstream's base path).
///
/// Dot segments are resolved (RFC 3986 section 5.2.4) before any such decision, including their
/// percent-encoded spellings ("%2e", "%2E"), because an upstream that decodes and normalises would
/// otherwise see a different path than the one the decision was made on: "/x/../public/y" is under
/// "/public", and "/../../etc" must not climb out of the upstream's base path.
public enum TargetPath {
    /// The path part of an origin-form target and the rest ("?query", possibly empty).
    public static func split(_ target: ArraySlice<UInt8>) -> (path: ArraySlice<UInt8>, query: ArraySlice<UInt8>) {
        if let mark = target.firstIndex(of: UInt8(ascii: "?")) {
            return (target[target.startIndex..<mark], target[mark...])
        }
        return (target, target[target.endIndex...])
    }

    /// Whether the path has a segment that is "." or ".." (in any spelling).
    public static func hasDotSegments(_ path: ArraySlice<UInt8>) -> Bool {
        var found = false
        forEachSegment(path) { segment in if dotKind(segment) != 0 { found = true } }
        return found
    }

    /// The path with dot segments resolved; ".." at the root stays at the root. Other bytes are unchanged
    /// (no decoding), and a path that ends in a dot segment keeps a trailing slash.
    public static func removingDotSegments(_ path: ArraySlice<UInt8>) -> [UInt8] {
        guard path.first == UInt8(ascii: "/") else { return Array(path) }
        var segments: [ArraySlice<UInt8>] = []
        var trailingSlash = false
        forEachSegment(path) { segment in
            switch dotKind(segment) {
            case 1:
                trailingSlash = true
            case 2:
                if !segments.isEmpty { segments.removeLast() }
                trailingSlash = true
            default:
                segments.append(segment)
                trailingSlash = false
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(path.count)
        for segment in segments {
            out.append(UInt8(ascii: "/"))
            out.append(contentsOf: segment)
        }
        if trailingSlash || out.isEmpty { out.append(UInt8(ascii: "/")) }
        return out
    }

    /// `path` is `prefix` or lies below it: "/public" matches "/public" and "/public/x", not "/publicity".
    /// A prefix ending in "/" matches what starts with it.
    public static func hasPrefix(_ path: ArraySlice<UInt8>, _ prefix: [UInt8]) -> Bool {
        guard path.count >= prefix.count, path.starts(with: prefix) else { return false }
        if prefix.last == UInt8(ascii: "/") || path.count == prefix.count { return true }
        return path[path.startIndex + prefix.count] == UInt8(ascii: "/")
    }

    /// Segments after each "/" (the first "/" opens the first segment; an empty path has none).
    private static func forEachSegment(_ path: ArraySlice<UInt8>, _ body: (ArraySlice<UInt8>) -> Void) {
        guard path.first == UInt8(ascii: "/") else { return }
        var start = path.startIndex + 1
        var i = start
        while i <= path.endIndex {
            if i == path.endIndex || path[i] == UInt8(ascii: "/") {
                body(path[start..<i])
                start = i + 1
            }
            i += 1
        }
    }

    /// 1 for ".", 2 for "..", 0 otherwise; "%2e" counts as a dot.
    private static func dotKind(_ segment: ArraySlice<UInt8>) -> Int {
        var dots = 0
        var i = segment.startIndex
        while i < segment.endIndex {
            if segment[i] == UInt8(ascii: ".") {
                i += 1
            } else if segment[i] == UInt8(ascii: "%") {
                guard segment.endIndex - i >= 3, segment[i + 1] == UInt8(ascii: "2"), segment[i + 2] | 0x20 == UInt8(ascii: "e") else { return 0 }
                i += 3
            } else {
                return 0
            }
            dots += 1
            if dots > 2 { return 0 }
        }
        return dots
    }
}
