import Glibc

/// What the tests' hand-written upstreams share: a listening socket on 127.0.0.1 with a port of the
/// kernel's choosing, and reading one request head byte by byte from an accepted connection.
enum LoopbackListener {
    /// A listening socket on 127.0.0.1, or the reason it could not be made.
    static func open() throws -> (fd: Int32, port: UInt16) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = fd >= 0 && withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Bool in
                bind(fd, pointer, length) == 0 && listen(fd, 4) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else {
            let reason = String(cString: strerror(errno))
            if fd >= 0 { close(fd) }
            throw ClientError("upstream listen: \(reason)")
        }
        return (fd, UInt16(bigEndian: address.sin_port))
    }

    /// Reads up to and including the blank line that ends a request head (or until the peer stops).
    static func readHead(_ fd: Int32) -> [UInt8] {
        var seen: [UInt8] = []
        var byte: UInt8 = 0
        while Glibc.read(fd, &byte, 1) == 1 {
            seen.append(byte)
            if seen.suffix(4) == [13, 10, 13, 10] { break }
        }
        return seen
    }
}
