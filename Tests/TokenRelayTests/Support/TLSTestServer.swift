import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `Fixtures/tls_test_server.py` as a child process: an HTTPS API and token endpoint on 127.0.0.1.
///
/// Python's `ssl` module gives a real, independent TLS implementation to test against (including
/// client-certificate checks) without a TLS server of our own. Output goes to files, the port is the
/// first stdout line, and the process is stopped by PID (also on deinit, so a failing test cannot leak it).
final class TLSTestServer: @unchecked Sendable { // immutable after init; `process` is thread-safe
    static let initialAccessToken = "initial-access"
    static let initialRefreshToken = "initial-refresh"

    let port: Int
    let stderrURL: URL
    private let process: Process

    var stderrText: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    /// - Parameter clientCA: when set, a client certificate signed by it is required.
    /// - Parameter tls12Only: at most TLS 1.2, where a missing client certificate fails inside the
    ///   handshake. Under TLS 1.3 the server's alert comes after the client's handshake is done and can
    ///   race with the connection closing, so the client does not always get to read it.
    init(identity: TestPKI.Identity, clientCA: URL? = nil, tls12Only: Bool = false, workDir: URL) throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/tls_test_server.py")
        let name = "tls-server-\(UUID().uuidString.prefix(8))"
        let stdoutURL = workDir.appendingPathComponent("\(name).out")
        stderrURL = workDir.appendingPathComponent("\(name).err")
        for url in [stdoutURL, stderrURL] { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
        var arguments = ["python3", script.path, "--cert", identity.cert.path, "--key", identity.key.path,
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
        var found: Int?
        let process = process
        waitUntil(timeout: 15) {
            let text = (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first, text.contains("\n") { found = Int(line) }
            return found != nil || !process.isRunning
        }
        guard let found else {
            process.terminate()
            throw TestSupportError("TLS test server did not start; stderr:\n\((try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "")")
        }
        port = found
    }

    deinit { stop() }

    func url(host: String = "localhost", path: String = "") -> String { "https://\(host):\(port)\(path)" }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if !waitUntil(timeout: 5, { !self.process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
        waitUntil(timeout: 5) { !self.process.isRunning }
    }
}
