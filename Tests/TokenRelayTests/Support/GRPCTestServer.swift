import Foundation

/// `Fixtures/grpc_api_server.py` as a child process: a grpcio server (h2c) whose calls must carry a token
/// that the `FakeTokenServer` says is current (the script's docstring lists its methods). Stopped by its PID.
final class GRPCTestServer: @unchecked Sendable { // immutable after init
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")

    let port: Int
    let controlPort: Int
    let python: String
    private let process: PythonFixtureProcess

    var url: String { "http://127.0.0.1:\(port)" }
    var stderrText: String { process.stderrText }

    /// `maxConnectionAgeMilliseconds`: each connection is ended with GOAWAY at that age.
    init(tokenServer: FakeTokenServer, workDir: URL, maxConnectionAgeMilliseconds: Int? = nil) throws {
        python = try Python.withGRPC()
        var settings: [String: Any] = ["introspect_url": tokenServer.baseURL + FakeTokenServer.introspectionPath]
        if let age = maxConnectionAgeMilliseconds { settings["max_connection_age_ms"] = age }
        process = try PythonFixtureProcess(script: Self.fixtures.appendingPathComponent("grpc_api_server.py"), settings: settings,
                                           workDir: workDir, name: "grpc api server", portCount: 2, python: python)
        (port, controlPort) = (process.ports[0], process.ports[1])
    }

    func stop() { process.stop() }

    /// {"calls": {method: n}, "ok": {method: n}, "unauthenticated": {method: n}, "connections": n}
    func stats() throws -> [String: Any] {
        let response = try HTTPTestClient.send(port: controlPort, method: "GET", path: "/stats")
        guard response.status == 200, let json = response.json() else { throw TestSupportError("grpc server stats: \(response.status)") }
        return json
    }

    func count(_ kind: String, _ method: String) throws -> Int { (try stats()[kind] as? [String: Any])?[method] as? Int ?? 0 }

    /// Runs `Fixtures/grpc_client.py PORT MODE ARGS` against `port` (tokenrelay's) and returns its JSON outcome.
    func client(port: Int, _ mode: String, _ arguments: [Int] = [], timeout: Double = 120) throws -> [String: Any] {
        let script = Self.fixtures.appendingPathComponent("grpc_client.py")
        let result = try runTool(python, [script.path, String(port), mode] + arguments.map(String.init), timeout: timeout)
        guard let outcome = try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any] else {
            throw TestSupportError("grpc_client.py \(mode) gave no outcome (exit \(result.exitCode)): \(result.stdout) \(result.stderr)")
        }
        return outcome
    }
}

extension Python {
    /// A python3 with grpcio: Debian's python3-grpcio is for /usr/bin/python3, which may not be the first
    /// python3 on PATH. Installed by `scripts/ensure-deps --test` when neither has it.
    static func withGRPC() throws -> String {
        func find() -> String? {
            ["/usr/bin/python3", "python3"].first { (try? runTool($0, ["-c", "import grpc"], timeout: 30))?.exitCode == 0 }
        }
        if let python = find() { return python }
        _ = try? runTool(repositoryRoot.appendingPathComponent("scripts/ensure-deps").path, ["--test"], timeout: 600)
        guard let python = find() else {
            throw TestSupportError("python3 module grpc missing and scripts/ensure-deps --test could not install it")
        }
        return python
    }
}
