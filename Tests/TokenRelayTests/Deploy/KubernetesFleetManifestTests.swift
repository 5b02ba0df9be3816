import Foundation
import XCTest

/// deploy/kubernetes/fleet: the fleet variant scales out (3 replicas, a rolling update with surge, no
/// volume claim), takes the Redis password and client secret from Secrets under the names its config
/// uses, probes readiness on /readyz, and its embedded config passes the schema and `tokenrelay check`.
final class KubernetesFleetManifestTests: XCTestCase {
    private let directory = repositoryRoot.appendingPathComponent("deploy/kubernetes/fleet")

    private func documents() throws -> [[String: Any]] {
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".yaml") }.sorted()
        XCTAssertEqual(files, ["configmap.yaml", "deployment.yaml", "secret.example.yaml"])
        return try files.flatMap { try loadYAMLDocuments(directory.appendingPathComponent($0)) }
    }

    private func name(_ object: [String: Any]) -> String? { (object["metadata"] as? [String: Any])?["name"] as? String }

    func testFleetDeploymentScalesOutAndAgreesWithItsConfig() throws {
        let all = try documents()
        XCTAssertTrue(all.filter { $0["kind"] as? String == "PersistentVolumeClaim" }.isEmpty, "no PVC: Redis is the store")
        let deployment = try XCTUnwrap(all.first { $0["kind"] as? String == "Deployment" })
        let spec = try XCTUnwrap(deployment["spec"] as? [String: Any])
        XCTAssertEqual(spec["replicas"] as? Int, 3)
        let strategy = try XCTUnwrap(spec["strategy"] as? [String: Any])
        XCTAssertEqual(strategy["type"] as? String, "RollingUpdate")
        XCTAssertEqual((strategy["rollingUpdate"] as? [String: Any])?["maxSurge"] as? Int, 1)
        let pod = try XCTUnwrap((spec["template"] as? [String: Any])?["spec"] as? [String: Any])
        for volume in pod["volumes"] as? [[String: Any]] ?? [] {
            XCTAssertNil(volume["persistentVolumeClaim"], "no volume claim in a fleet pod")
        }
        let relay = try XCTUnwrap((pod["containers"] as? [[String: Any]])?.first { $0["name"] as? String == "tokenrelay" })
        let readiness = try XCTUnwrap((relay["readinessProbe"] as? [String: Any])?["httpGet"] as? [String: Any])
        XCTAssertEqual(readiness["path"] as? String, "/readyz")

        let configMap = try XCTUnwrap(all.first { $0["kind"] as? String == "ConfigMap" })
        let configText = try XCTUnwrap((configMap["data"] as? [String: Any])?["config.json"] as? String)
        let config = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(configText.utf8)) as? [String: Any])
        XCTAssertEqual(((pod["volumes"] as? [[String: Any]])?.first?["configMap"] as? [String: Any])?["name"] as? String, name(configMap))
        let tokens = try XCTUnwrap(config["tokens"] as? [String: Any])
        XCTAssertNil(tokens["file"], "no token file in a fleet pod")
        let redis = try XCTUnwrap(tokens["redis"] as? [String: Any])
        XCTAssertTrue((redis["url"] as? String)?.hasPrefix("redis://") ?? false)

        // Both secrets come from Secrets, under the variables the config names.
        let environment = relay["env"] as? [[String: Any]] ?? []
        let secrets = all.filter { $0["kind"] as? String == "Secret" }
        for variable in [try XCTUnwrap(redis["password_env"] as? String),
                         try XCTUnwrap((config["refresh"] as? [String: Any])?["client_secret_env"] as? String)] {
            let entry = try XCTUnwrap(environment.first { $0["name"] as? String == variable }, variable)
            let reference = try XCTUnwrap((entry["valueFrom"] as? [String: Any])?["secretKeyRef"] as? [String: Any], variable)
            let secret = try XCTUnwrap(secrets.first { name($0) == reference["name"] as? String }, "Secret for \(variable)")
            XCTAssertNotNil((secret["stringData"] as? [String: Any])?[reference["key"] as? String ?? ""], variable)
        }

        // The embedded config passes the schema and check (which does not contact Redis).
        let workDir = makeTemporaryDirectory(prefix: "tokenrelay-k8s-fleet")
        defer { try? FileManager.default.removeItem(at: workDir) }
        let configURL = workDir.appendingPathComponent("fleet.json")
        try Data(configText.utf8).write(to: configURL)
        XCTAssertEqual(try ConfigSchema.errors(for: [configURL])[configURL.path], [])
        let check = try TokenRelayProcess.runCommand(arguments: ["check", "--config", configURL.path],
                                                     environment: ["TOKENRELAY_CLIENT_SECRET": "s", "TOKENRELAY_REDIS_PASSWORD": "p"])
        XCTAssertEqual(check.exitCode, 0, check.stderr)
        XCTAssertTrue(check.stdout.contains("Redis"), check.stdout)
    }
}
