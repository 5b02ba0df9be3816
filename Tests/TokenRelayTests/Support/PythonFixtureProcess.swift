import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A Python test server started as `python3 <script> <settings.json>`: the settings are written as JSON
/// into the test's work directory, and the script's first stdout line lists the ports it bound (ephemeral,
/// on 127.0.0.1), separated by spaces. Stopped by its PID: SIGTERM, then SIGKILL after 5 s (also on deinit).
/// The fixtures built on it (`AssertionTokenEndpoint`, `DPoPServer`) add only their ports' meaning and
/// their control calls.
final class PythonFixtureProcess: @unchecked Sendable { // immutable after init; Process is thread-safe
    let ports: [Int]
    private let process: Process
    private let stderrURL: URL

    var stderrText: String { (try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "" }

    /// `name`: what the script is, for file names and for the error when it does not start. `python`: the
    /// interpreter (a path, or a name looked up on PATH).
    init(script: URL, settings: [String: Any], workDir: URL, name: String, portCount: Int, python: String = "python3") throws {
        let base = "\(name)-\(UUID().uuidString.prefix(8))"
        let configURL = workDir.appendingPathComponent("\(base).json")
        try JSONSerialization.data(withJSONObject: settings).write(to: configURL)
        let stdoutURL = workDir.appendingPathComponent("\(base).out")
        stderrURL = workDir.appendingPathComponent("\(base).err")
        for url in [stdoutURL, stderrURL] { _ = FileManager.default.createFile(atPath: url.path, contents: nil) }
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [python, script.path, configURL.path]
        process.standardInput = FileHandle.nullDevice
        let out = try FileHandle(forWritingTo: stdoutURL), err = try FileHandle(forWritingTo: stderrURL)
        defer { try? out.close(); try? err.close() }
        process.standardOutput = out
        process.standardError = err
        try process.run()
        var found: [Int] = []
        let process = process
        waitUntil(timeout: 15) {
            let text = (try? String(contentsOf: stdoutURL, encoding: .utf8)) ?? ""
            if let line = text.split(separator: "\n").first, text.contains("\n") { found = line.split(separator: " ").compactMap { Int($0) } }
            return found.count == portCount || !process.isRunning
        }
        guard found.count == portCount else {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            throw TestSupportError("\(name) did not start; stderr:\n\((try? String(contentsOf: stderrURL, encoding: .utf8)) ?? "")")
        }
        ports = found
    }

    deinit { stop() }

    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        if !waitUntil(timeout: 5, { !self.process.isRunning }) { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }
}
