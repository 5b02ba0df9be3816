import Glibc

/// An IP address and port as the socket calls want them: parsed from a literal, or as the resolver gave it;
/// or a unix socket path. Names are not resolved here: resolving must not block the loop, so it happens in
/// `NameLookup`.
struct SocketAddress {
    var storage = sockaddr_storage()
    var length: socklen_t = 0
    var family: Int32 = AF_INET

    /// "127.0.0.1", "0.0.0.0", "::1", "[::1]", "::"; nil for anything else.
    init?(host: String, port: UInt16) {
        var literal = host
        if literal.hasPrefix("[") && literal.hasSuffix("]") { literal = String(literal.dropFirst().dropLast()) }
        var v4 = sockaddr_in()
        if inet_pton(AF_INET, literal, &v4.sin_addr) == 1 {
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = port.bigEndian
            withUnsafeBytes(of: &v4) { source in
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: source) }
            }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
            family = AF_INET
            return
        }
        var v6 = sockaddr_in6()
        if inet_pton(AF_INET6, literal, &v6.sin6_addr) == 1 {
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = port.bigEndian
            withUnsafeBytes(of: &v6) { source in
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: source) }
            }
            length = socklen_t(MemoryLayout<sockaddr_in6>.size)
            family = AF_INET6
            return
        }
        return nil
    }

    /// A unix socket path; nil if it is empty, holds a NUL, or does not fit `sun_path` with its terminator.
    init?(unixPath path: String) {
        var address = sockaddr_un()
        let bytes = Array(path.utf8)
        guard !bytes.isEmpty, !bytes.contains(0), bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in raw.copyBytes(from: bytes) }
        withUnsafeBytes(of: &address) { source in
            withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: source) }
        }
        length = socklen_t(MemoryLayout<sockaddr_un>.size)
        family = AF_UNIX
    }

    /// An IPv4 or IPv6 address from the resolver; nil for any other family.
    init?(_ address: UnsafePointer<sockaddr>, length: socklen_t) {
        let family = Int32(address.pointee.sa_family)
        guard family == AF_INET || family == AF_INET6, Int(length) <= MemoryLayout<sockaddr_storage>.size else { return nil }
        withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: UnsafeRawBufferPointer(start: address, count: Int(length))) }
        self.length = length
        self.family = family
    }

    func withSockaddr<T>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
        var copy = storage
        return withUnsafePointer(to: &copy) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) }
        }
    }
}

extension SocketAddress {
    /// Every IPv4 and IPv6 address of a `getaddrinfo` answer, in its order.
    static func all(in list: UnsafeMutablePointer<addrinfo>?) -> [SocketAddress] {
        var addresses: [SocketAddress] = []
        var node = list
        while let entry = node {
            if let address = entry.pointee.ai_addr, let converted = SocketAddress(address, length: entry.pointee.ai_addrlen) {
                addresses.append(converted)
            }
            node = entry.pointee.ai_next
        }
        return addresses
    }
}
