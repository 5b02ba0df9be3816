import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `Fixtures/dpop_server.py` as a child process: a DPoP token endpoint and API that verify every proof with
/// python3 `cryptography` (the script's docstring lists its rules and settings). Stopped by its PID.
final class DPoPServer: @unchecked Sendable { // immutable after init; Process is thread-safe
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/dpop_server.py")

    let tokenPort: Int
    let apiPort: Int
    let controlPort: Int
    private let process: Process
    private let stderrURL: URL

    var tokenURL: String { "http://127.0.0.1:\(tokenPort)/token" }
    var apiURL: String { "http://127.0.0.1:\(apiPort)" }
    var stderrText: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    init(settings: [String: Any], workDir: URL) throws {
        try Python.ensureCryptography()
        let name = "dpop-server-\(UUID().uuidString.prefix(8))"
        let configURL = workDir.appendingPathComponent("\(name).json")
        try JSONSerialization.data(withJSONObject: settings).write(to: configURL)
        let stdoutURL = workDir.appendingPathComponent("\(name).out")
        stderrURL = workDir.appendingPathComponent("\(name).err")
        for url in [stdoutURL, stderrURL] { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", Self.script.path, configURL.path]
        process.standardInput = FileHandle.nullDevice
        let out = try FileHandle(forWritingTo: stdoutURL), err = try FileHandle(forWritingTo: stderrURL)
        defer { try? out.close(); try? err.close() }
        process.standardOutput = out
        process.standardError = err
        try process.run()
        var ports: [Int] = []
        let process = process
        waitUntil(timeout: 15) {
            let text = (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first, text.contains("\n") { ports = line.split(separator: " ").compactMap { Int($0) } }
            return ports.count == 3 || !process.isRunning
        }
        guard ports.count == 3 else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            throw TestSupportError("dpop server did not start; stderr:\n\((try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "")")
        }
        (tokenPort, apiPort, controlPort) = (ports[0], ports[1], ports[2])
    }

    deinit { stop() }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if !waitUntil(timeout: 5, { !self.process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    func stats() throws -> [String: Any] {
        let response = try HTTPTestClient.send(port: controlPort, method: "GET", path: "/stats")
        guard response.status == 200, let json = response.json() else { throw TestSupportError("stats: \(response.status)") }
        return json
    }

    func count(_ key: String) throws -> Int { try stats()[key] as? Int ?? -1 }

    func post(_ path: String) throws {
        _ = try HTTPTestClient.send(port: controlPort, method: "POST", path: path, body: Data())
    }
}
