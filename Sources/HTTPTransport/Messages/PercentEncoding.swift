import CLibevent
import Glibc

/// Percent-encoding for URL components and `application/x-www-form-urlencoded` values, by libevent's
/// encoder (`evhttp_uriencode`): every byte but RFC 3986's unreserved characters (letters, digits,
/// `-`, `.`, `_`, `~`) becomes `%XX`, so the result is safe in a query, a form body or a path segment.
public enum PercentEncoding {
    /// - Parameter spaceAsPlus: write a space as `+` (the form convention) instead of `%20`.
    public static func encode(_ value: String, spaceAsPlus: Bool = false) -> String {
        var value = value
        // The length is passed, so a NUL inside the string is encoded instead of ending it.
        let encoded = value.withUTF8 { bytes in
            bytes.withMemoryRebound(to: CChar.self) { evhttp_uriencode($0.baseAddress, bytes.count, spaceAsPlus ? 1 : 0) }
        }
        guard let encoded else { return "" }
        defer { free(encoded) }
        return String(cString: encoded)
    }
}
