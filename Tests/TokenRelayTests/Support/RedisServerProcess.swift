import Foundation
import TLSFixtures
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// A real `redis-server` for fleet tests, listening on a unix socket in its own directory (no port to
/// collide with) and, when asked, on a 127.0.0.1 port too. Stopped by PID (SIGTERM, then SIGKILL);
/// `restart()` starts it again with the same directory, so an AOF written before survives. With `tls`,
/// it also listens for TLS on a 127.0.0.1 port (`tlsPort`) with the PKI's server certificate.
final class RedisServerProcess: @unchecked Sendable {
    let directory: URL
    let socketPath: String
    let tcpPort: Int?
    let tlsPort: Int?
    private let tls: TestPKI?
    private let appendOnly: Bool
    /// More `redis-server` options (a replica's `--replicaof host port`).
    private let extraArguments: [String]
    private var process: Process?

    var url: String { "unix://\(socketPath)" }
    var pid: Int32? { process?.processIdentifier }

    /// Skips the calling test (with the reason) when redis-server is not installed; `scripts/ensure-deps
    /// --test` installs it, so CI runs these tests.
    static func requireInstalled() throws {
        guard toolExists("redis-server"), toolExists("redis-cli") else {
            throw XCTSkip("redis-server is not installed (scripts/ensure-deps --test installs it)")
        }
    }

    init(appendOnly: Bool = false, tcp: Bool = false, tls: TestPKI? = nil, extraArguments: [String] = []) throws {
        try Self.requireInstalled()
        directory = makeTemporaryDirectory(prefix: "tokenrelay-redis")
        socketPath = directory.appendingPathComponent("redis.sock").path
        self.appendOnly = appendOnly
        self.tls = tls
        self.extraArguments = extraArguments
        tcpPort = tcp ? try Self.freeLoopbackPort() : nil
        tlsPort = tls != nil ? try Self.freeLoopbackPort() : nil
        try start()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(at: directory)
    }

    func start() throws {
        var arguments = ["--port", "\(tcpPort ?? 0)", "--bind", "127.0.0.1", "--unixsocket", socketPath, "--unixsocketperm", "700",
                         "--dir", directory.path, "--save", "", "--daemonize", "no", "--logfile", directory.appendingPathComponent("redis.log").path]
        if appendOnly { arguments += ["--appendonly", "yes", "--appendfsync", "always"] }
        arguments += extraArguments
        if let tls, let tlsPort {
            // Clients are not asked for a certificate: the relay's server verification is what is tested.
            arguments += ["--tls-port", "\(tlsPort)", "--tls-cert-file", tls.server.cert.path, "--tls-key-file", tls.server.key.path,
                          "--tls-ca-cert-file", tls.caFile.path, "--tls-auth-clients", "no"]
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["redis-server"] + arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        // A configuration error is printed on stderr before the log file is opened.
        let stderrURL = directory.appendingPathComponent("redis.stderr")
        _ = FileManager.default.createFile(atPath: stderrURL.path, contents: nil)
        let stderrHandle = try FileHandle(forWritingTo: stderrURL)
        defer { try? stderrHandle.close() }
        process.standardError = stderrHandle
        try process.run()
        self.process = process
        guard waitUntil(timeout: 10, interval: 0.02, { (try? cli(["PING"])) == "PONG" || !process.isRunning }), process.isRunning else {
            let log = ((try? String(contentsOf: directory.appendingPathComponent("redis.log"), encoding: .utf8)) ?? "")
                + ((try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "")
            stop()
            // A redis-server built without TLS refuses the tls-* options ("TLS not supported" or an unknown
            // directive): skip with its words rather than fail.
            if tls != nil, log.contains("TLS not supported") || log.contains("Bad directive") {
                throw XCTSkip("redis-server has no TLS support on this image: \(log.suffix(300))")
            }
            throw TestSupportError("redis-server did not answer PING within 10 s; log:\n\(log.suffix(2000))")
        }
    }

    /// SIGTERM (an AOF is flushed on the way out), SIGKILL after 5 s.
    func stop() {
        guard let process, process.isRunning else { return }
        terminateRedisProcess(process)
        self.process = nil
    }

    /// SIGKILL, as a crash leaves it: no flush, no goodbye to replicas or clients.
    func kill9() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        waitUntil(timeout: 5) { !process.isRunning }
        self.process = nil
    }

    func restart() throws {
        stop()
        try start()
    }

    /// One redis-cli command against this server; its output without the trailing newline.
    @discardableResult
    func cli(_ arguments: [String]) throws -> String {
        try redisCLI(["-s", socketPath], arguments)
    }

    static func freeLoopbackPort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError("socket failed") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0 else { throw TestSupportError("bind failed") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}
