import HTTPTransport
import Glibc

/// `upstream`: serves on a free 127.0.0.1 port (printed as `listening PORT`) until killed; see
/// `TokenCheckingUpstream`.
func runUpstream() {
    do {
        let loop = try TransportLoop()
        let upstream = TokenCheckingUpstream()
        let server = try HTTPServer(loop: loop, host: "127.0.0.1", port: 0, backlog: 4096) { upstream.accepted($0) }
        say("listening \(server.port)")
        loop.run()
        withExtendedLifetime(server) {}
    } catch {
        say("fleet-burst-load upstream: \(error)")
        exit(1)
    }
}

/// `burst`: COUNT requests at once, round-robin over the ports, one connection each; prints one JSON line
/// when every request has been answered or has failed, and exits.
func runBurst(count: Int, ports: [UInt16]) {
    do {
        let loop = try TransportLoop()
        let burst = Burst(loop: loop, count: count, ports: ports) { summary in
            say(summary)
            loop.stop()
        }
        burst.start()
        loop.run()
        withExtendedLifetime(burst) {}
    } catch {
        say("fleet-burst-load burst: \(error)")
        exit(1)
    }
}

/// One line on stdout, flushed at once (the script reads it while this process runs).
func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

/// CLOCK_MONOTONIC seconds: the clock Python's `time.monotonic()` reads on Linux, so the script can
/// subtract its own timestamps from ours.
func monotonicNow() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1_000_000_000
}
