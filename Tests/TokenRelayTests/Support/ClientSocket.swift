import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A connected loopback client socket with its line reader, closed exactly once (by `close()` or deinit).
final class ClientSocket {
    let fd: Int32
    let reader: SocketReader
    private var closed = false

    /// `receiveBuffer` shrinks the kernel's socket buffer, so a slow reader really is slow for the sender.
    init(port: Int, timeout: Double, receiveBuffer: Int32? = nil) throws {
        fd = try LoopbackSocket.connect(port: port, timeout: timeout)
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        reader = SocketReader(fd: fd)
    }

    deinit { close() }

    func close() {
        guard !closed else { return }
        closed = true
        Glibc.close(fd)
    }
}
