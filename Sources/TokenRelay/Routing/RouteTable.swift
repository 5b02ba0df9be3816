/// Which route a request on the main listener belongs to, decided once from its head: by Host and/or
/// the start of its path (`routes[].match`). Routes with their own `listen` are not in it: everything on
/// their listener is theirs.
///
/// Built once per configuration; a lookup compares bytes the head already holds and allocates nothing,
/// and a config without routes answers `.defaultRoute` before reading the head at all (the single-route
/// path costs one branch).
///
/// Order: routes naming a host come before routes that do not (the Host picks the site, as a virtual host
/// would), and among each, the longest path prefix wins. A prefix matches on a segment boundary: `/hr`
/// takes `/hr`, `/hr/x` and `/hr?q`, never `/hrx`; a prefix ending in `/` takes what starts with it.
struct RouteTable {
    enum Resolution: Equatable {
        /// The top-level `upstream` (and identity).
        case defaultRoute
        /// `routes[index]`; `strip`: bytes of the path to drop before it goes upstream (`strip_prefix`),
        /// leaving a remainder that starts with `/`, `?` or nothing (see `strippedTarget`).
        case route(index: Int, strip: Int)
        /// No route, and no top-level upstream: tokenrelay answers 404 itself.
        case none
    }

    private struct Entry {
        let index: Int
        /// Lower-cased; nil: any host.
        let host: [UInt8]?
        let hostHasPort: Bool
        let prefix: [UInt8]
        let strip: Bool
    }

    private let entries: [Entry]
    private let hasDefaultRoute: Bool

    init(routes: [Config.Route], hasDefaultRoute: Bool) {
        self.hasDefaultRoute = hasDefaultRoute
        let entries = routes.enumerated().compactMap { index, route -> Entry? in
            guard route.listen == nil, let match = route.match else { return nil }
            let host = match.host.map { Array($0.lowercased().utf8) }
            return Entry(index: index, host: host, hostHasPort: host.map(Self.hasPort) ?? false,
                         prefix: Array((match.pathPrefix ?? "").utf8), strip: match.stripPrefix)
        }
        // Stable: equal keys keep config order (the loader refuses two identical matches anyway).
        self.entries = entries.enumerated().sorted { a, b in
            let (x, y) = (a.element, b.element)
            if (x.host != nil) != (y.host != nil) { return x.host != nil }
            if x.prefix.count != y.prefix.count { return x.prefix.count > y.prefix.count }
            return a.offset < b.offset
        }.map(\.element)
    }

    var isEmpty: Bool { entries.isEmpty }

    /// `host`: the Host field's value (nil when absent); `target`: the request target as received.
    func resolve(host: UnsafeBufferPointer<UInt8>?, target: UnsafeBufferPointer<UInt8>) -> Resolution {
        guard !entries.isEmpty else { return hasDefaultRoute ? .defaultRoute : .none }
        var host = host
        var pathStart = 0
        if target.first != UInt8(ascii: "/") {
            // absolute-form: the authority in the target is the host (RFC 9112 §3.2.2), the path follows it.
            guard let split = Self.absoluteFormSplit(target) else { return hasDefaultRoute ? .defaultRoute : .none }
            host = UnsafeBufferPointer(rebasing: target[split.authority])
            pathStart = split.pathStart
        }
        for entry in entries {
            if let wanted = entry.host {
                guard let host, Self.hostMatches(wanted, hasPort: entry.hostHasPort, host) else { continue }
            }
            guard Self.pathMatches(entry.prefix, target, from: pathStart) else { continue }
            var strip = 0
            if entry.strip {
                strip = pathStart + entry.prefix.count
                if entry.prefix.last == UInt8(ascii: "/") { strip -= 1 }
            }
            return .route(index: entry.index, strip: strip)
        }
        return hasDefaultRoute ? .defaultRoute : .none
    }

    /// Appends the target to send upstream after dropping `strip` bytes: always origin-form, `/` when
    /// nothing is left, `/?q` when only the query is.
    static func appendStripped(_ target: ArraySlice<UInt8>, strip: Int, to buffer: inout [UInt8]) {
        let rest = target.dropFirst(strip)
        if rest.first != UInt8(ascii: "/") { buffer.append(UInt8(ascii: "/")) }
        buffer.append(contentsOf: rest)
    }

    private static func pathMatches(_ prefix: [UInt8], _ target: UnsafeBufferPointer<UInt8>, from start: Int) -> Bool {
        if prefix.isEmpty { return true }
        let available = target.count - start
        guard available >= prefix.count else {
            // An absolute-form target with no path asks for `/`.
            return available == 0 && prefix == [UInt8(ascii: "/")]
        }
        for offset in 0..<prefix.count where target[start + offset] != prefix[offset] { return false }
        if prefix.last == UInt8(ascii: "/") || available == prefix.count { return true }
        let next = target[start + prefix.count]
        return next == UInt8(ascii: "/") || next == UInt8(ascii: "?")
    }

    /// Lower-case ASCII comparison; a pattern without a port ignores the field's port (and a trailing dot).
    private static func hostMatches(_ wanted: [UInt8], hasPort: Bool, _ host: UnsafeBufferPointer<UInt8>) -> Bool {
        var end = host.count
        if !hasPort, let portStart = portStart(host) { end = portStart }
        if end > 0, host[end - 1] == UInt8(ascii: "."), wanted.last != UInt8(ascii: ".") { end -= 1 }
        guard end == wanted.count else { return false }
        for offset in 0..<end {
            var byte = host[offset]
            if byte >= 0x41 && byte <= 0x5A { byte |= 0x20 }
            if byte != wanted[offset] { return false }
        }
        return true
    }

    /// Where `:port` starts in a host field, if it has one (`[v6]:port` aware).
    private static func portStart(_ host: UnsafeBufferPointer<UInt8>) -> Int? {
        guard let colon = host.lastIndex(of: UInt8(ascii: ":")) else { return nil }
        if host.first == UInt8(ascii: "[") {
            return colon > 0 && host[colon - 1] == UInt8(ascii: "]") ? colon : nil
        }
        return host.firstIndex(of: UInt8(ascii: ":")) == colon ? colon : nil
    }

    private static func hasPort(_ host: [UInt8]) -> Bool {
        host.withUnsafeBufferPointer { portStart($0) != nil }
    }

    /// `scheme://authority/path`: the authority's range and where the path starts (the target's end when
    /// it has none). Nil for any other form.
    private static func absoluteFormSplit(_ target: UnsafeBufferPointer<UInt8>) -> (authority: Range<Int>, pathStart: Int)? {
        var index = 0
        while index + 2 < target.count {
            if target[index] == UInt8(ascii: ":") {
                guard target[index + 1] == UInt8(ascii: "/"), target[index + 2] == UInt8(ascii: "/") else { return nil }
                let authorityStart = index + 3
                var end = authorityStart
                while end < target.count, target[end] != UInt8(ascii: "/"), target[end] != UInt8(ascii: "?") { end += 1 }
                return (authorityStart..<end, end)
            }
            index += 1
        }
        return nil
    }
}
