import Foundation

/// `Fixtures/oauth_probe_server.py` as a child process: a strict token endpoint and DPoP API written apart from
/// tokenrelay's code and the other fixtures, checking what a real identity provider and API check (the script's
/// docstring lists every rule and setting). Stopped by its PID.
final class OAuthProbeServer: @unchecked Sendable { // immutable after init; Process is thread-safe
    let tokenPort: Int
    let apiPort: Int
    let controlPort: Int
    private let process: PythonFixtureProcess

    var tokenURL: String { "http://127.0.0.1:\(tokenPort)/token" }
    var apiURL: String { "http://127.0.0.1:\(apiPort)" }
    var stderrText: String { process.stderrText }

    init(settings: [String: Any], workDir: URL) throws {
        try Python.ensureCryptography()
        process = try PythonFixtureProcess(script: testFixtures.appendingPathComponent("oauth_probe_server.py"), settings: settings,
                                           workDir: workDir, name: "oauth probe server", portCount: 3)
        (tokenPort, apiPort, controlPort) = (process.ports[0], process.ports[1], process.ports[2])
    }

    func stop() { process.stop() }

    /// Counters, `failures` (every rule a request broke) and `log` (every request: headers, form).
    func stats() throws -> [String: Any] {
        let response = try HTTPTestClient.send(port: controlPort, method: "GET", path: "/stats")
        guard response.status == 200, let json = response.json() else { throw TestSupportError("stats: \(response.status)") }
        return json
    }

    func count(_ key: String) throws -> Int { try stats()[key] as? Int ?? -1 }

    /// Every access token issued so far stops being accepted by the API.
    func expireAccessTokens() throws {
        _ = try HTTPTestClient.send(port: controlPort, method: "POST", path: "/expire", body: Data())
    }

    /// Changes one of the script's settings while it runs.
    func set(_ key: String, _ jsonValue: String) throws {
        _ = try HTTPTestClient.send(port: controlPort, method: "POST", path: "/set/\(key)=\(jsonValue)", body: Data())
    }

    /// What tokenrelay sent that a real server would keep from others: refresh tokens, assertions, proofs,
    /// access tokens (from the requests the server saw).
    func secretsSeen() throws -> [String] {
        var secrets: [String] = []
        for record in try stats()["log"] as? [[String: Any]] ?? [] {
            for pair in record["form"] as? [[String]] ?? [] where ["refresh_token", "client_assertion", "assertion"].contains(pair.first) {
                secrets.append(pair[1])
            }
            for (name, value) in record["headers"] as? [String: String] ?? [:] where ["dpop", "authorization"].contains(name.lowercased()) {
                secrets.append(String(value.split(separator: " ").last ?? ""))
            }
        }
        return secrets.filter { $0.count > 16 }
    }
}
