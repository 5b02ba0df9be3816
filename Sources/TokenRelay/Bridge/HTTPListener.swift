import CLibevent
import Glibc

/// An evhttp server bound to one address, handing each complete request to `handler`.
///
/// Binding without SO_REUSEPORT is deliberate: a second tokenrelay on the same address must fail at start
/// instead of silently splitting traffic between two token managers (docs/evhttp.md, reuseport).
final class HTTPListener {
    let http: OpaquePointer
    let handler: (OpaquePointer) -> Void
    /// `evhttp_free` needs the `event_base` still alive: the listener keeps its loop.
    private let loop: EventLoop
    private var boundSocket: OpaquePointer?
    private(set) var boundPort: Int = 0

    struct BindError: Error, CustomStringConvertible {
        let description: String
    }

    init(loop: EventLoop, host: String, port: Int, handler: @escaping (OpaquePointer) -> Void) throws {
        guard let http = evhttp_new(loop.base) else { throw BindError(description: "evhttp_new failed") }
        self.http = http
        self.handler = handler
        self.loop = loop
        // Every method evhttp can parse (its default omits OPTIONS, PATCH, TRACE, CONNECT; docs/evhttp.md, methods).
        let all = EVHTTP_REQ_GET.rawValue | EVHTTP_REQ_POST.rawValue | EVHTTP_REQ_HEAD.rawValue
            | EVHTTP_REQ_PUT.rawValue | EVHTTP_REQ_DELETE.rawValue | EVHTTP_REQ_OPTIONS.rawValue
            | EVHTTP_REQ_TRACE.rawValue | EVHTTP_REQ_CONNECT.rawValue | EVHTTP_REQ_PATCH.rawValue
        evhttp_set_allowed_methods(http, UInt16(all))
        // A proxy must not invent a Content-Type (docs/evhttp.md, content-type); nil also avoids the stored-pointer trap.
        evhttp_set_default_content_type(http, nil)
        // Lets an over-limit client read our 413 instead of seeing a reset (docs/evhttp.md, lingering-close).
        evhttp_set_flags(http, Int32(EVHTTP_SERVER_LINGERING_CLOSE))
        evhttp_set_gencb(http, listenerRequestTrampoline, unretainedContext(self))
        guard let socket = evhttp_bind_socket_with_handle(http, host, UInt16(port)) else {
            let reason = String(cString: strerror(errno))
            throw BindError(description: "cannot listen on \(host):\(port): \(reason)")
        }
        boundSocket = socket
        let fd = evhttp_bound_socket_get_fd(socket)
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        boundPort = Int(UInt16(bigEndian: address.sin_port))
    }

    func setLimits(maxHeaderBytes: Int, maxBodyBytes: Int, timeoutSeconds: Double) {
        evhttp_set_max_headers_size(http, maxHeaderBytes)
        evhttp_set_max_body_size(http, Int(maxBodyBytes))
        var tv = timeval(seconds: timeoutSeconds)
        evhttp_set_timeout_tv(http, &tv)
    }

    /// evhttp listens with a fixed backlog of 128, which drops connects during a spike (the client retries
    /// a second later). Calling listen() again on the listening socket sets a new backlog (Linux keeps the
    /// socket and its queue; the kernel caps the value at net.core.somaxconn).
    func setBacklog(_ backlog: Int) {
        guard let boundSocket else { return }
        _ = listen(evhttp_bound_socket_get_fd(boundSocket), Int32(clamping: backlog))
    }

    /// Stops accepting new connections; connections already open keep being served.
    func stopAccepting() {
        if let boundSocket {
            evhttp_del_accept_socket(http, boundSocket)
            self.boundSocket = nil
        }
    }

    deinit {
        evhttp_free(http)
    }
}
