import HTTPTransport
import Glibc

/// Runs the relay on the calling thread until killed (kept out of main.swift, whose closures would be
/// inferred to run on the main actor).
func runBenchRelay(listenPort: UInt16, upstreamPort: UInt16, token: String) {
    do {
        let loop = try TransportLoop()
        let relay = BenchRelay(loop: loop, upstreamHost: "127.0.0.1", upstreamPort: upstreamPort, token: token)
        let server = try HTTPServer(loop: loop, host: "127.0.0.1", port: listenPort) { relay.accepted($0) }
        let line = Array("listening on 127.0.0.1:\(server.port)\n".utf8)
        _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
        loop.run()
        withExtendedLifetime(server) {}
    } catch {
        print("transport-bench-relay: \(error)")
        exit(1)
    }
}
