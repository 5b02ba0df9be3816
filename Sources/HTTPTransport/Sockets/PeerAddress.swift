import Glibc

/// The address of the other end of a connection, as `accept` (or `connect`) gave it: no getpeername later.
public struct PeerAddress: Sendable, Equatable, CustomStringConvertible {
    /// The IP address in text form ("127.0.0.1", "::1").
    public let host: String
    public let port: UInt16

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    init?(_ storage: inout sockaddr_storage) {
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        switch Int32(storage.ss_family) {
        case AF_INET:
            let (address, port) = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { ($0.pointee.sin_addr, $0.pointee.sin_port) }
            }
            var copy = address
            guard inet_ntop(AF_INET, &copy, &text, socklen_t(text.count)) != nil else { return nil }
            self.port = UInt16(bigEndian: port)
        case AF_INET6:
            let (address, port) = withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { ($0.pointee.sin6_addr, $0.pointee.sin6_port) }
            }
            var copy = address
            guard inet_ntop(AF_INET6, &copy, &text, socklen_t(text.count)) != nil else { return nil }
            self.port = UInt16(bigEndian: port)
        default:
            return nil
        }
        host = String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
