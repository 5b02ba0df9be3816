import Glibc

/// Whole-line writes to stdout/stderr and reading all of stdin with plain `write`/`read`, as
/// `FileHandle` did (unbuffered: a line is out before the next thing happens).
public enum StandardStreams {
    public static func writeOut(_ text: String) { write(text, to: STDOUT_FILENO) }
    public static func writeError(_ text: String) { write(text, to: STDERR_FILENO) }

    public static func readAllInput() -> [UInt8] {
        var data: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = read(STDIN_FILENO, &chunk, chunk.count)
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return data }
            data.append(contentsOf: chunk[0..<count])
        }
    }

    private static func write(_ text: String, to fd: Int32) {
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if written < 0, errno == EINTR { continue }
            guard written > 0 else { return }
            offset += written
        }
    }
}
