import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A TCP forwarder from 127.0.0.1:`listenPort` in one network namespace to 127.0.0.1:`connectPort` in
/// another, so a relay inside a namespace ("host") reaches the test's fake servers on the root
/// namespace's loopback, and the test reaches the relay's listeners, without any address outside the
/// namespaces the test created. Which namespace a socket lives in is fixed when it is created, and
/// `setns` moves only the calling thread: so every socket is created on a thread of this bridge that
/// first joined the right namespace. Threads poll with a short timeout and end once `stop()` is called.
final class NamespaceBridge: @unchecked Sendable {
    /// The port it listens on (the ephemeral port chosen when `listenPort` is 0).
    private(set) var port = 0
    private let stopped = Locked(false)
    private let openDescriptors = Locked<Set<Int32>>([])
    private let listenNamespaceFD: Int32
    private let connectNamespaceFD: Int32
    private let connectPort: Int
    private var listenFD: Int32 = -1

    /// nil namespace: the namespace the calling thread is in now (the test's).
    init(listenIn listenNamespace: NetworkNamespace?, listenPort: Int = 0,
         connectIn connectNamespace: NetworkNamespace?, connectPort: Int) throws {
        func open(_ namespace: NetworkNamespace?) throws -> Int32 {
            let path = namespace.map { "/run/netns/\($0.name)" } ?? "/proc/thread-self/ns/net"
            let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw TestSupportError("open \(path): errno \(errno)") }
            return fd
        }
        listenNamespaceFD = try open(listenNamespace)
        connectNamespaceFD = try open(connectNamespace)
        self.connectPort = connectPort
        let created = Locked<Result<(Int32, Int), TestSupportError>?>(nil)
        let ready = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            created.withLock { $0 = Result { try self.makeListener(port: listenPort) }.mapError { $0 as? TestSupportError ?? TestSupportError("\($0)") } }
            ready.signal()
            if case .success = created.withLock({ $0! }) { self.acceptLoop() }
        }
        thread.start()
        guard ready.wait(timeout: .now() + 10) == .success else { throw TestSupportError("bridge listener not created in 10 s") }
        (listenFD, port) = try created.withLock { $0! }.get()
    }

    deinit { stop() }

    func stop() {
        guard stopped.withLock({ let was = $0; $0 = true; return !was }) else { return }
        // Threads see `stopped` within one poll interval and close their own descriptors; shutting the
        // connections down makes their peers see the end at once.
        openDescriptors.withLock { $0.forEach { shutdown($0, Int32(SHUT_RDWR)) } }
    }

    private var isStopped: Bool { stopped.withLock { $0 } }

    private func join(_ namespaceFD: Int32) throws {
        typealias SetNS = @convention(c) (Int32, Int32) -> Int32
        guard let symbol = dlsym(nil, "setns") else { throw TestSupportError("setns not found") }
        let setns = unsafeBitCast(symbol, to: SetNS.self)
        guard setns(namespaceFD, 0x4000_0000 /* CLONE_NEWNET */) == 0 else { throw TestSupportError("setns: errno \(errno)") }
    }

    private func makeListener(port: Int) throws -> (Int32, Int) {
        try join(listenNamespaceFD)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError("socket: errno \(errno)") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.loopback(port: port)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 128) == 0 else { close(fd); throw TestSupportError("bind/listen 127.0.0.1:\(port): errno \(errno)") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return (fd, Int(UInt16(bigEndian: address.sin_port)))
    }

    private func acceptLoop() {
        defer { close(listenFD) }
        while !isStopped {
            var pfd = pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 50) > 0 else { continue }
            let client = accept(listenFD, nil, nil)
            guard client >= 0 else { continue }
            Thread { [self] in self.serve(client) }.start()
        }
    }

    /// Connects in the other namespace and copies both ways until both directions ended.
    private func serve(_ client: Int32) {
        guard (try? join(connectNamespaceFD)) != nil else { close(client); return }
        let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = Self.loopback(port: connectPort)
        let connected = server >= 0 && withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
        guard connected, !isStopped else {
            if server >= 0 { close(server) }
            close(client)
            return
        }
        openDescriptors.withLock { $0.formUnion([client, server]) }
        let otherDirection = DispatchSemaphore(value: 0)
        Thread { [self] in self.copy(from: server, to: client); otherDirection.signal() }.start()
        copy(from: client, to: server)
        while otherDirection.wait(timeout: .now() + 0.05) != .success {
            if isStopped { shutdown(server, Int32(SHUT_RDWR)); shutdown(client, Int32(SHUT_RDWR)) }
        }
        openDescriptors.withLock { $0.subtract([client, server]) }
        close(client)
        close(server)
    }

    private func copy(from source: Int32, to destination: Int32) {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        loop: while !isStopped {
            var pfd = pollfd(fd: source, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 50) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { recv(source, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            var offset = 0
            while offset < count {
                let written = buffer.withUnsafeBytes { send(destination, $0.baseAddress! + offset, count - offset, Int32(MSG_NOSIGNAL)) }
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else { break loop }
                offset += written
            }
        }
        shutdown(destination, Int32(SHUT_WR))
    }

    private static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        return address
    }
}
