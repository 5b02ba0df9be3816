import Foundation
import Glibc

/// A throwaway PKI made with the `openssl` command line once per test process (nothing long-lived is
/// committed): a CA, a server certificate for localhost and 127.0.0.1, one for another name only, and a
/// client certificate. EC P-256 keys keep generation to a fraction of a second.
struct TransportTestPKI: Sendable {
    struct Identity: Sendable {
        let cert: String
        let key: String
    }

    let caFile: String
    /// SAN `DNS:localhost, IP:127.0.0.1`.
    let server: Identity
    /// SAN `DNS:wrong.example.com` only.
    let wrongHost: Identity
    /// CN `transport-client`, extendedKeyUsage clientAuth.
    let client: Identity

    private static let generated = Result { try generate() }

    static func shared() throws -> TransportTestPKI { try generated.get() }

    private static func generate() throws -> TransportTestPKI {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("transport-pki-\(getpid())-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(atPath: TransportTestPKI.directoryToRemove) }
        directoryLock.withLock { _directory = dir }
        func path(_ name: String) -> String { "\(dir)/\(name)" }
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try openssl(["req", "-x509"] + ec + ["-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "3",
                                             "-subj", "/CN=transport test CA"], in: dir)
        func issue(_ name: String, cn: String, extensions: String) throws -> Identity {
            try openssl(["req"] + ec + ["-keyout", path("\(name).key"), "-out", path("\(name).csr"), "-subj", "/CN=\(cn)"], in: dir)
            try extensions.write(toFile: path("\(name).ext"), atomically: true, encoding: .utf8)
            try openssl(["x509", "-req", "-in", path("\(name).csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                         "-set_serial", "\(UInt32.random(in: 1...UInt32.max))", "-extfile", path("\(name).ext"),
                         "-out", path("\(name).pem"), "-days", "3"], in: dir)
            return Identity(cert: path("\(name).pem"), key: path("\(name).key"))
        }
        return TransportTestPKI(
            caFile: path("ca.pem"),
            server: try issue("server", cn: "localhost", extensions: "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
            wrongHost: try issue("wrong-host", cn: "wrong.example.com", extensions: "subjectAltName=DNS:wrong.example.com\nextendedKeyUsage=serverAuth\n"),
            client: try issue("client", cn: "transport-client", extensions: "extendedKeyUsage=clientAuth\n"))
    }

    private static let directoryLock = NSLock()
    nonisolated(unsafe) private static var _directory = ""
    static var directoryToRemove: String { directoryLock.withLock { _directory } }

    private static func openssl(_ arguments: [String], in dir: String) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl"] + arguments
        process.currentDirectoryURL = URL(fileURLWithPath: dir)
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(30)
        while process.isRunning && Date() < deadline { usleep(10_000) }   // polling a child with a deadline
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            throw FixtureError("openssl \(arguments.first ?? "") did not finish within 30 s")
        }
        guard process.terminationStatus == 0 else {
            throw FixtureError("openssl \(arguments.joined(separator: " ")) failed (\(process.terminationStatus))")
        }
    }
}

struct FixtureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// `Fixtures/tls_upstream.py` as a child process: an HTTPS/1.1 upstream on 127.0.0.1 (Python's `ssl`, an
/// implementation independent of ours). Stopped by its PID, also on deinit.
final class TLSUpstream: @unchecked Sendable {   // immutable after init; Process is thread-safe
    let port: UInt16
    private let process: Process
    private let stderrPath: String

    var stderrText: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }

    init(identity: TransportTestPKI.Identity, clientCA: String? = nil, tls12Only: Bool = false) throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/tls_upstream.py").path
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("tls-upstream-\(UUID().uuidString.prefix(8))").path
        let stdoutPath = base + ".out"
        stderrPath = base + ".err"
        for path in [stdoutPath, stderrPath] { _ = FileManager.default.createFile(atPath: path, contents: nil) }
        var arguments = ["python3", script, "--cert", identity.cert, "--key", identity.key]
        if let clientCA { arguments += ["--client-ca", clientCA] }
        if tls12Only { arguments.append("--tls12-only") }
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        let out = try FileHandle(forWritingTo: URL(fileURLWithPath: stdoutPath))
        let err = try FileHandle(forWritingTo: URL(fileURLWithPath: stderrPath))
        defer { try? out.close(); try? err.close() }
        process.standardOutput = out
        process.standardError = err
        try process.run()
        var found: UInt16?
        let deadline = Date().addingTimeInterval(15)
        while found == nil && process.isRunning && Date() < deadline {
            let text = (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? ""
            if text.contains("\n"), let line = text.split(separator: "\n").first { found = UInt16(line) }
            if found == nil { usleep(10_000) }   // polling the child's output with a deadline
        }
        try? FileManager.default.removeItem(atPath: stdoutPath)
        guard let found else {
            let pid = process.processIdentifier
            if process.isRunning { kill(pid, SIGKILL) }
            throw FixtureError("TLS upstream did not start: \((try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "")")
        }
        port = found
    }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: stderrPath)
    }

    deinit { stop() }
}
