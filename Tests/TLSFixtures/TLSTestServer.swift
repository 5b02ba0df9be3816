import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `tls_server.py` (beside this file, found via #filePath) as a child process: an HTTPS server on
/// 127.0.0.1 on Python's `ssl`, an implementation independent of ours. `Role.upstream` is HTTPTransport's
/// echo upstream, `Role.api` tokenrelay's API and token endpoint (the script's docstring lists the paths).
/// Output goes to files, the port is the first stdout line, and the process is stopped by its PID (also on
/// deinit, so a failing test cannot leak it).
public final class TLSTestServer: @unchecked Sendable {   // immutable after init; Process is thread-safe
    public enum Role: String, Sendable {
        case upstream
        case api
    }

    public static let initialAccessToken = "initial-access"
    public static let initialRefreshToken = "initial-refresh"

    public let port: UInt16
    public let stderrURL: URL
    private let process: Process
    private let removesOutput: Bool

    public var stderrText: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    /// - Parameter clientCA: when set, a client certificate signed by it is required.
    /// - Parameter tls12Only: at most TLS 1.2, where a refused client certificate fails inside the
    ///   handshake. Under TLS 1.3 the server's alert comes after the client's handshake is done and can
    ///   race with the connection closing, so the client does not always get to read it.
    /// - Parameter workDir: where the output files go (kept for the test to inspect); without it a
    ///   temporary file, removed by `stop()`.
    public init(role: Role, identity: TestPKI.Identity, clientCA: URL? = nil, tls12Only: Bool = false, workDir: URL? = nil) throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("tls_server.py")
        let name = "tls-server-\(UUID().uuidString.prefix(8))"
        let directory = workDir ?? FileManager.default.temporaryDirectory
        let stdoutURL = directory.appendingPathComponent("\(name).out")
        stderrURL = directory.appendingPathComponent("\(name).err")
        removesOutput = workDir == nil
        for url in [stdoutURL, stderrURL] { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
        var arguments = ["python3", script.path, "--role", role.rawValue, "--cert", identity.cert.path, "--key", identity.key.path,
                         "--access", Self.initialAccessToken, "--refresh", Self.initialRefreshToken]
        if let clientCA { arguments += ["--client-ca", clientCA.path] }
        if tls12Only { arguments.append("--tls12-only") }
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        let out = try FileHandle(forWritingTo: stdoutURL), err = try FileHandle(forWritingTo: stderrURL)
        defer { try? out.close(); try? err.close() }
        process.standardOutput = out
        process.standardError = err
        try process.run()
        var found: UInt16?
        let process = process
        pollUntil(timeout: 15) {
            let text = (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first, text.contains("\n") { found = UInt16(line) }
            return found != nil || !process.isRunning
        }
        try? FileManager.default.removeItem(at: stdoutURL)
        guard let found else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            throw TLSFixtureError("TLS test server did not start; stderr:\n\((try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "")")
        }
        port = found
    }

    deinit { stop() }

    public func url(host: String = "localhost", path: String = "") -> String { "https://\(host):\(port)\(path)" }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            if !pollUntil(timeout: 5, { !self.process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        if removesOutput { try? FileManager.default.removeItem(at: stderrURL) }
    }
}
