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
    private let process: PythonFixtureProcess

    var tokenURL: String { "http://127.0.0.1:\(tokenPort)/token" }
    var apiURL: String { "http://127.0.0.1:\(apiPort)" }
    var stderrText: String { process.stderrText }

    init(settings: [String: Any], workDir: URL) throws {
        try Python.ensureCryptography()
        process = try PythonFixtureProcess(script: Self.script, settings: settings, workDir: workDir,
                                           name: "dpop server", portCount: 3)
        (tokenPort, apiPort, controlPort) = (process.ports[0], process.ports[1], process.ports[2])
    }

    func stop() { process.stop() }

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
