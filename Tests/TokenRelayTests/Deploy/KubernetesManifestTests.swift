import Foundation
import XCTest

/// deploy/kubernetes: every manifest parses (PyYAML), and the Deployment, Job, Secret and PVC agree with the
/// config embedded in the ConfigMap, which itself passes the schema and `tokenrelay check`.
final class KubernetesManifestTests: XCTestCase {
    private let directory = repositoryRoot.appendingPathComponent("deploy/kubernetes")
    private var workDir: URL!

    override func setUpWithError() throws { workDir = makeTemporaryDirectory(prefix: "tokenrelay-k8s") }
    override func tearDownWithError() throws { if let workDir { try? FileManager.default.removeItem(at: workDir) } }

    private struct Manifests {
        var documents: [[String: Any]] = []
        func all(_ kind: String) -> [[String: Any]] { documents.filter { $0["kind"] as? String == kind } }
        func one(_ kind: String) throws -> [String: Any] {
            let matches = all(kind)
            guard matches.count == 1 else { throw TestSupportError("expected one \(kind), found \(matches.count)") }
            return matches[0]
        }
    }

    private func loadManifests() throws -> Manifests {
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".yaml") }.sorted()
        XCTAssertFalse(files.isEmpty)
        var manifests = Manifests()
        for file in files {
            let documents = try loadYAMLDocuments(directory.appendingPathComponent(file))
            XCTAssertFalse(documents.isEmpty, file)
            for document in documents {
                XCTAssertNotNil(document["apiVersion"] as? String, "\(file): apiVersion")
                XCTAssertNotNil(document["kind"] as? String, "\(file): kind")
                XCTAssertNotNil((document["metadata"] as? [String: Any])?["name"] as? String, "\(file): metadata.name")
            }
            manifests.documents += documents
        }
        return manifests
    }

    private func name(_ object: [String: Any]) -> String? { (object["metadata"] as? [String: Any])?["name"] as? String }

    private func podSpec(_ workload: [String: Any]) throws -> [String: Any] {
        let spec = try XCTUnwrap(workload["spec"] as? [String: Any])
        let template = try XCTUnwrap(spec["template"] as? [String: Any])
        return try XCTUnwrap(template["spec"] as? [String: Any])
    }

    private func containers(_ pod: [String: Any]) -> [[String: Any]] { pod["containers"] as? [[String: Any]] ?? [] }

    private func port(_ address: Any?) throws -> Int {
        let text = try XCTUnwrap(address as? String)
        return try XCTUnwrap(text.split(separator: ":").last.flatMap { Int($0) }, text)
    }

    /// A probe's port, resolving a named port through the container's `ports`.
    private func resolvePort(_ value: Any?, in container: [String: Any]) -> Int? {
        if let number = value as? Int { return number }
        guard let name = value as? String else { return nil }
        return (container["ports"] as? [[String: Any]])?.first { $0["name"] as? String == name }?["containerPort"] as? Int
    }

    /// The volume behind the mount that holds `path`, or nil.
    private func volume(holding path: String, container: [String: Any], pod: [String: Any]) -> [String: Any]? {
        let mounts = container["volumeMounts"] as? [[String: Any]] ?? []
        guard let mount = mounts.first(where: { mount in
            guard let mountPath = mount["mountPath"] as? String else { return false }
            return path.hasPrefix(mountPath.hasSuffix("/") ? mountPath : mountPath + "/")
        }) else { return nil }
        return (pod["volumes"] as? [[String: Any]])?.first { $0["name"] as? String == mount["name"] as? String }
    }

    func testManifestsAgreeWithEmbeddedConfig() throws {
        let manifests = try loadManifests()
        let configMap = try manifests.one("ConfigMap")
        let configText = try XCTUnwrap((configMap["data"] as? [String: Any])?["config.json"] as? String)
        let config = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(configText.utf8)) as? [String: Any])
        let refresh = try XCTUnwrap(config["refresh"] as? [String: Any])
        let tokenFile = try XCTUnwrap((config["tokens"] as? [String: Any])?["file"] as? String)
        let listenPort = try port(config["listen"])
        let adminAddress = try XCTUnwrap((config["admin"] as? [String: Any])?["listen"] as? String)
        let adminPort = try port(adminAddress)
        // The kubelet probes the pod IP: an admin listener on loopback would fail every probe.
        XCTAssertFalse(adminAddress.hasPrefix("127.") || adminAddress.hasPrefix("[::1]"), "admin.listen must not be loopback")

        let deployment = try manifests.one("Deployment")
        let pod = try podSpec(deployment)
        let relay = try XCTUnwrap(containers(pod).first { $0["name"] as? String == "tokenrelay" })
        let apps = containers(pod).filter { $0["name"] as? String != "tokenrelay" }
        XCTAssertFalse(apps.isEmpty, "an app container next to the sidecar")
        XCTAssertEqual((deployment["spec"] as? [String: Any])?["replicas"] as? Int, 1, "one owner per token family")
        XCTAssertEqual(((deployment["spec"] as? [String: Any])?["strategy"] as? [String: Any])?["type"] as? String, "Recreate")

        // Ports and probes.
        let containerPorts = Set((relay["ports"] as? [[String: Any]] ?? []).compactMap { $0["containerPort"] as? Int })
        XCTAssertEqual(containerPorts, [listenPort, adminPort])
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let httpGet = try XCTUnwrap((relay[probe] as? [String: Any])?["httpGet"] as? [String: Any], probe)
            XCTAssertEqual(httpGet["path"] as? String, path, probe)
            XCTAssertEqual(resolvePort(httpGet["port"], in: relay), adminPort, "\(probe) port")
        }
        // The app reaches the API through the sidecar on loopback.
        let appEnvironment = apps.flatMap { $0["env"] as? [[String: Any]] ?? [] }.compactMap { $0["value"] as? String }
        XCTAssertTrue(appEnvironment.contains { $0.hasPrefix("http://127.0.0.1:\(listenPort)") }, "app env: \(appEnvironment)")

        // Config comes from the ConfigMap, at the path the container's arguments name.
        let arguments = (relay["command"] as? [String] ?? []) + (relay["args"] as? [String] ?? [])
        let configIndex = try XCTUnwrap(arguments.firstIndex(of: "--config"), "\(arguments)")
        let configPath = arguments[configIndex + 1]
        XCTAssertTrue(configPath.hasSuffix("/config.json"))
        let configVolume = try XCTUnwrap(volume(holding: configPath, container: relay, pod: pod), "no mount holds \(configPath)")
        XCTAssertEqual((configVolume["configMap"] as? [String: Any])?["name"] as? String, name(configMap))

        // Token file on the PVC.
        let tokenVolume = try XCTUnwrap(volume(holding: tokenFile, container: relay, pod: pod), "no mount holds \(tokenFile)")
        let claim = try XCTUnwrap((tokenVolume["persistentVolumeClaim"] as? [String: Any])?["claimName"] as? String)
        XCTAssertEqual(claim, name(try manifests.one("PersistentVolumeClaim")))

        // The admin bearer token from its own Secret, mounted where admin.token_file says.
        let adminTokenFile = try XCTUnwrap((config["admin"] as? [String: Any])?["token_file"] as? String, "admin.token_file")
        let adminTokenVolume = try XCTUnwrap(volume(holding: adminTokenFile, container: relay, pod: pod), "no mount holds \(adminTokenFile)")
        let adminSecretName = try XCTUnwrap((adminTokenVolume["secret"] as? [String: Any])?["secretName"] as? String)
        let adminSecret = try XCTUnwrap(manifests.all("Secret").first { name($0) == adminSecretName }, adminSecretName)
        XCTAssertNotNil((adminSecret["stringData"] as? [String: Any])?[URL(fileURLWithPath: adminTokenFile).lastPathComponent])

        // Client secret from the Secret, under the variable the config names.
        let secretEnv = try XCTUnwrap(refresh["client_secret_env"] as? String)
        let envEntry = try XCTUnwrap((relay["env"] as? [[String: Any]])?.first { $0["name"] as? String == secretEnv }, secretEnv)
        let secretRef = try XCTUnwrap((envEntry["valueFrom"] as? [String: Any])?["secretKeyRef"] as? [String: Any])
        let secret = try XCTUnwrap(manifests.all("Secret").first { name($0) == secretRef["name"] as? String }, "Secret \(secretRef)")
        let secretKeys = Set(((secret["stringData"] as? [String: Any]) ?? (secret["data"] as? [String: Any]) ?? [:]).keys)
        XCTAssertTrue(secretKeys.contains(try XCTUnwrap(secretRef["key"] as? String)))

        // The bootstrap Job writes to the same claim, at the same directory, as the same user.
        let job = try manifests.one("Job")
        let jobPod = try podSpec(job)
        let writer = try XCTUnwrap(containers(jobPod).first)
        let jobVolume = try XCTUnwrap(volume(holding: tokenFile, container: writer, pod: jobPod))
        XCTAssertEqual((jobVolume["persistentVolumeClaim"] as? [String: Any])?["claimName"] as? String, claim)
        let podSecurity = try XCTUnwrap(pod["securityContext"] as? [String: Any])
        let jobSecurity = try XCTUnwrap(jobPod["securityContext"] as? [String: Any])
        for key in ["runAsUser", "runAsGroup", "fsGroup"] {
            XCTAssertNotNil(podSecurity[key] as? Int, key)
            XCTAssertEqual(podSecurity[key] as? Int, jobSecurity[key] as? Int, key)
        }
        XCTAssertEqual(podSecurity["fsGroupChangePolicy"] as? String, "OnRootMismatch",
                       "a recursive fsGroup chmod would make tokens.json group-readable, which tokenrelay refuses")
        XCTAssertEqual(podSecurity["runAsUser"] as? Int, try containerfileUser(), "Deployment and image run as the same uid")

        // The embedded config is valid: schema, and `check` with its paths moved to temp files.
        let configURL = workDir.appendingPathComponent("embedded.json")
        try Data(configText.utf8).write(to: configURL)
        XCTAssertEqual(try ConfigSchema.errors(for: [configURL])[configURL.path], [])
        var local = config
        let localTokens = workDir.appendingPathComponent("tokens.json")
        try writeTokenFile(at: localTokens, access: "a", refresh: "r")
        setValue(&local, path: "tokens.file", localTokens.path)
        let localURL = workDir.appendingPathComponent("local.json")
        try JSONSerialization.data(withJSONObject: local).write(to: localURL)
        let check = try TokenRelayProcess.runCommand(arguments: ["check", "--config", localURL.path],
                                                     environment: [secretEnv: "k8s-test-secret"])
        XCTAssertEqual(check.exitCode, 0, check.stderr)
    }

    /// The numeric uid of the Containerfile's `USER`.
    private func containerfileUser() throws -> Int? {
        let text = try String(contentsOf: repositoryRoot.appendingPathComponent("deploy/container/Containerfile"), encoding: .utf8)
        let line = text.split(separator: "\n").last { $0.hasPrefix("USER ") }
        return line.flatMap { Int($0.dropFirst(5).split(separator: ":")[0]) }
    }
}
