import Glibc

/// The systemd notification protocol (sd_notify(3)) without libsystemd: `READY=1`, `RELOADING=1`,
/// `STOPPING=1` and `WATCHDOG=1` datagrams to the AF_UNIX socket named by `NOTIFY_SOCKET` (a path, or `@name` for the
/// abstract namespace). Without `NOTIFY_SOCKET` every call is a no-op, so running outside systemd
/// (or under `Type=simple`) costs nothing.
///
/// Watchdog pings come from a timer on the event loop, every `WATCHDOG_USEC / 2`: a loop that is stuck
/// stops pinging and systemd restarts the service, which is the point of the watchdog.
final class SystemdNotifier {
    /// The socket address, or nil when notifications are disabled.
    private let address: (storage: sockaddr_un, length: socklen_t)?
    /// Seconds between watchdog pings, or nil when the watchdog is not enabled for this process.
    let watchdogInterval: Double?
    private var watchdogTimer: LoopEvent?

    var isEnabled: Bool { address != nil }

    init(environment: (String) -> String? = { getenv($0).map { String(cString: $0) } }, pid: pid_t = getpid()) {
        address = environment("NOTIFY_SOCKET").flatMap(Self.socketAddress)
        watchdogInterval = Self.watchdogInterval(usec: environment("WATCHDOG_USEC"), pid: environment("WATCHDOG_PID"), ownPID: pid)
    }

    /// The service is up: listeners bound, a usable token loaded. Starts the watchdog pings on `loop`.
    func ready(loop: EventLoop, status: String) {
        send("READY=1\nSTATUS=\(status)")
        guard isEnabled, let interval = watchdogInterval, watchdogTimer == nil else { return }
        let timer = LoopEvent.repeating(loop: loop) { [unowned self] in self.send("WATCHDOG=1") }
        timer.schedule(after: interval)
        watchdogTimer = timer
    }

    /// A reload (SIGHUP) has begun; `ready` ends it. systemd wants the CLOCK_MONOTONIC time with it, to
    /// tell this reload's READY=1 from an earlier one.
    func reloading() {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        send("RELOADING=1\nMONOTONIC_USEC=\(Int64(now.tv_sec) * 1_000_000 + Int64(now.tv_nsec) / 1_000)")
    }

    /// A reload is over (applied or refused: either way the service runs).
    func reloaded(status: String) {
        send("READY=1\nSTATUS=\(status)")
    }

    /// Shutdown has begun (systemd shows the unit as deactivating). Watchdog pings go on while draining.
    func stopping() {
        send("STOPPING=1")
    }

    /// Frees the watchdog timer; call before the event loop goes away.
    func close() {
        watchdogTimer = nil
    }

    /// One datagram, best effort: a failure to notify must never take the proxy down (systemd reports a
    /// service that never became ready on its own).
    func send(_ message: String) {
        guard let address else { return }
        var storage = address.storage
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { Glibc.close(fd) }
        var bytes = Array(message.utf8)
        _ = withUnsafePointer(to: &storage) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sockaddrPointer in
                sendto(fd, &bytes, bytes.count, Int32(MSG_NOSIGNAL), sockaddrPointer, address.length)
            }
        }
    }

    /// `/path/to/socket` or `@abstract-name` (leading `@` becomes a NUL byte); anything else, or a name
    /// longer than `sun_path`, disables notifications as sd_notify does.
    static func socketAddress(_ text: String) -> (sockaddr_un, socklen_t)? {
        var path = Array(text.utf8)
        guard let first = path.first, first == UInt8(ascii: "/") || first == UInt8(ascii: "@") else { return nil }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        let abstract = first == UInt8(ascii: "@")
        if abstract { path[0] = 0 }
        // A filesystem path needs room for its terminating NUL; an abstract name is length-delimited.
        guard path.count <= (abstract ? capacity : capacity - 1) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in path.enumerated() { raw[index] = byte }
        }
        let length = MemoryLayout<sockaddr_un>.offset(of: \.sun_path)! + path.count + (abstract ? 0 : 1)
        return (address, socklen_t(length))
    }

    /// sd_watchdog_enabled(3): `WATCHDOG_USEC` is a positive integer, and `WATCHDOG_PID`, when set, names
    /// this process (otherwise the variables were inherited from the process systemd actually watches).
    /// Pings are sent at half the timeout, as systemd recommends.
    static func watchdogInterval(usec: String?, pid: String?, ownPID: pid_t) -> Double? {
        guard let usec, let microseconds = UInt64(usec), microseconds > 0 else { return nil }
        if let pid, !pid.isEmpty {
            guard let watchdogPID = pid_t(pid), watchdogPID == ownPID else { return nil }
        }
        // At least every 10 ms: a tiny WATCHDOG_USEC would otherwise make the ping timer spin.
        return max(Double(microseconds) / 2_000_000, 0.01)
    }
}
