import Glibc

/// Reads a key file whole (blocking: off the loop). Errors name the path and the system's reason, never
/// the contents. Bounded: a PEM private key is a few KiB, so anything over 1 MiB is not one.
enum KeyFile {
    static let maximumSize = 1 << 20

    static func read(_ path: String) throws -> [UInt8] {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw JOSEError("cannot read \(path): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var contents: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw JOSEError("cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            contents.append(contentsOf: chunk[0..<count])
            guard contents.count <= maximumSize else { throw JOSEError("\(path) is larger than 1 MiB: not a PEM key") }
        }
        chunk.withUnsafeMutableBufferPointer { $0.update(repeating: 0) }
        return contents
    }
}
