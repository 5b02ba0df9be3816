import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// `Fixtures/assertion_token_endpoint.py` as a child process: a token endpoint that verifies client
/// assertions, jwt-bearer assertions and subject tokens with Python's `cryptography` (independent of
/// tokenrelay's JOSE code), and refuses a replayed `jti`. The script's docstring lists its settings and
/// paths. Stopped by its PID (also on deinit).
final class AssertionTokenEndpoint: @unchecked Sendable { // immutable after init; Process is thread-safe
    static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/assertion_token_endpoint.py")

    let tokenPort: Int
    let controlPort: Int
    let usesTLS: Bool
    private let process: PythonFixtureProcess

    var tokenURL: String { "\(usesTLS ? "https://localhost" : "http://127.0.0.1"):\(tokenPort)/token" }
    var stderrText: String { process.stderrText }

    /// `settings` as the script's docstring describes (client_id, client_auth, client_key, audience, …).
    init(settings: [String: Any], workDir: URL) throws {
        try Python.ensureCryptography()
        usesTLS = settings["cert"] != nil
        process = try PythonFixtureProcess(script: Self.script, settings: settings, workDir: workDir,
                                           name: "assertion token endpoint", portCount: 2)
        (tokenPort, controlPort) = (process.ports[0], process.ports[1])
    }

    func stop() { process.stop() }

    /// What the endpoint saw so far (see the script's /stats).
    func stats() throws -> [String: Any] {
        let response = try HTTPTestClient.send(port: controlPort, method: "GET", path: "/stats")
        guard response.status == 200, let json = response.json() else { throw TestSupportError("stats: \(response.status)") }
        return json
    }

    var granted: Int { ((try? stats())?["granted"] as? Int) ?? -1 }
    var requests: Int { ((try? stats())?["requests"] as? Int) ?? -1 }
    func strings(_ key: String) -> [String] { ((try? stats())?[key] as? [String]) ?? [] }
    var forms: [[String: String]] { ((try? stats())?["forms"] as? [[String: String]]) ?? [] }

    /// A projected service-account token signed by the endpoint's own "kubelet" key.
    func mint(subject: String, audience: String, lifetime: Int = 3600) throws -> String {
        let body = try JSONSerialization.data(withJSONObject: ["sub": subject, "aud": audience, "lifetime": lifetime])
        let response = try HTTPTestClient.send(port: controlPort, method: "POST", path: "/mint", body: body)
        guard let token = response.json()?["token"] as? String else { throw TestSupportError("mint: \(response.status)") }
        return token
    }

    func isValid(_ token: String) -> Bool {
        let query = token.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        return (try? HTTPTestClient.send(port: controlPort, method: "GET", path: "/introspect?token=\(query)").status) == 204
    }

    func expireAccessTokens() throws {
        _ = try HTTPTestClient.send(port: controlPort, method: "POST", path: "/expire", body: Data())
    }
}

extension Python {
    /// python3 with `cryptography` (Debian's python3-cryptography, installed by `scripts/ensure-deps --test`).
    static func ensureCryptography() throws {
        if (try? runTool("python3", ["-c", "import cryptography"], timeout: 30))?.exitCode == 0 { return }
        _ = try? runTool(repositoryRoot.appendingPathComponent("scripts/ensure-deps").path, ["--test"], timeout: 600)
        guard (try? runTool("python3", ["-c", "import cryptography"], timeout: 30))?.exitCode == 0 else {
            throw TestSupportError("python3 module cryptography missing and scripts/ensure-deps --test could not install it")
        }
    }
}

/// Private keys of every type tokenrelay signs with, made by the `openssl` command line.
enum TestKeys {
    enum Kind: String, CaseIterable { case rsa2048, rsa1024, p256, p384, ed25519 }

    static func make(_ kind: Kind, in directory: URL) throws -> URL {
        let url = directory.appendingPathComponent("\(kind.rawValue)-\(UUID().uuidString.prefix(6)).pem")
        let options: [String] = switch kind {
        case .rsa2048: ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
        case .rsa1024: ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"]
        case .p256: ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        case .p384: ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"]
        case .ed25519: ["-algorithm", "ED25519"]
        }
        let result = try runTool("openssl", ["genpkey"] + options + ["-out", url.path], timeout: 60)
        guard result.exitCode == 0 else { throw TestSupportError("openssl genpkey \(kind): \(result.stderr)") }
        return url
    }
}
