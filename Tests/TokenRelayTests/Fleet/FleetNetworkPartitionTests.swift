import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// Fleet relays on separate hosts: network namespaces joined by veth links. Redis runs on its own
/// "redis host", relays on host A and host B, each with a point-to-point link (a private /30 that exists
/// only between two namespaces this test created) to the redis host. The fake token server and API stay
/// on the test's loopback and are mirrored into each host's loopback by `NamespaceBridge`; no packet goes
/// to any address outside these namespaces or loopback. Skipped, with the reason, where `ip netns add` is
/// not permitted.
final class FleetNetworkPartitionTests: RelayTestCase {
    private let key = "tokenrelay:fleet-partition"

    func testAHostCutOffFromRedisBehavesAsUnreachableWhileOthersCarryOn() throws {
        try RedisServerProcess.requireInstalled()
        try NetworkNamespace.requirePermitted()
        let redisHost = try makeNamespace("r")
        let hostA = try makeNamespace("a")
        let hostB = try makeNamespace("b")
        try redisHost.link(to: hostA, localName: "tr-ra", peerName: "tr-ar", localAddress: "10.213.1.1", peerAddress: "10.213.1.2")
        try redisHost.link(to: hostB, localName: "tr-rb", peerName: "tr-br", localAddress: "10.213.2.1", peerAddress: "10.213.2.2")

        let socketPath = try startRedis(in: redisHost, bind: ["10.213.1.1", "10.213.2.1"])
        try importTokens(socketPath: socketPath)
        let relayA = try startHostRelay(in: hostA, redisAddress: "10.213.1.1")
        let relayB = try startHostRelay(in: hostB, redisAddress: "10.213.2.1")
        XCTAssertEqual(try get(relayA, "/before").status, 200)
        XCTAssertEqual(try get(relayB, "/before").status, 200)

        // Host A loses its only link to Redis.
        try hostA.ip(["link", "set", "tr-ar", "down"])
        XCTAssertTrue(waitUntil(timeout: 10) { self.storeField(relayA, "connected") as? Bool == false },
                      "host A sees Redis unreachable: \(relayA.stderrText.suffix(1500))")
        XCTAssertEqual(try get(relayA, "/cut-but-valid").status, 200, "host A serves with its valid token")
        XCTAssertEqual(try admin(relayA, "/readyz").status, 200, "a valid token keeps host A ready")
        XCTAssertEqual(storeField(relayB, "connected") as? Bool, true, "host B still talks to Redis")

        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relayB, "/b-refreshes").status, 200, "host B refreshes through Redis")
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        for index in 0..<4 {
            let response = try get(relayA, "/a-dead/\(index)")
            XCTAssertEqual(response.status, 503, response.bodyText)
            XCTAssertNotNil(response.header("Retry-After"), "503 carries Retry-After")
        }
        XCTAssertEqual(try admin(relayA, "/readyz").status, 503, "host A is not ready with a dead token and no Redis")
        XCTAssertTrue(try admin(relayA, "/status").bodyText.contains("token store unreachable"))
        for index in 0..<4 { XCTAssertEqual(try get(relayB, "/b-carries-on/\(index)").status, 200) }
        XCTAssertEqual(tokenServer.refreshCalls, 1, "host A never refreshes on its own; host B refreshed once")

        // The link comes back: host A adopts host B's version by itself, without refreshing.
        try hostA.ip(["link", "set", "tr-ar", "up"])
        XCTAssertTrue(waitUntil(timeout: 15) { self.storeField(relayA, "version") as? Int == 2 },
                      "host A adopted version 2: \(relayA.stderrText.suffix(1500))")
        XCTAssertEqual(try get(relayA, "/a-back").status, 200)
        XCTAssertEqual(try admin(relayA, "/readyz").status, 200)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    // MARK: - Hosts

    /// Created and registered for removal at once, so a failure anywhere later still removes it.
    private func makeNamespace(_ role: String) throws -> NetworkNamespace {
        let namespace = try NetworkNamespace(role: role)
        addTeardownBlock { namespace.delete() }
        return namespace
    }

    /// redis-server inside `namespace`, on TCP at `bind` (reachable only over the links) and on a unix
    /// socket the test's redis-cli and `token import` use (a path, not an address: it crosses namespaces).
    private func startRedis(in namespace: NetworkNamespace, bind: [String]) throws -> String {
        let directory = makeTemporaryDirectory(prefix: "tokenrelay-redis-host")
        let socketPath = directory.appendingPathComponent("redis.sock").path
        let process = Process()
        process.executableURL = URL(fileURLWithPath: NetworkNamespace.ipPath)
        process.arguments = Array(namespace.wrapper(["redis-server", "--port", "6379", "--bind"] + bind
            + ["--protected-mode", "no", "--unixsocket", socketPath, "--unixsocketperm", "700", "--dir", directory.path,
               "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", directory.appendingPathComponent("redis.log").path]).dropFirst())
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        let stderrURL = directory.appendingPathComponent("stderr.log")
        _ = FileManager.default.createFile(atPath: stderrURL.path, contents: nil)
        let stderrHandle = try FileHandle(forWritingTo: stderrURL)
        defer { try? stderrHandle.close() }
        process.standardError = stderrHandle
        try process.run()
        // Registered after the namespaces' blocks: runs before them (last in, first out).
        addTeardownBlock {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            waitUntil(timeout: 10) { !process.isRunning }
            try? FileManager.default.removeItem(at: directory)
        }
        guard waitUntil(timeout: 10, { (try? self.redisCLI(socketPath, ["PING"])) == "PONG" || !process.isRunning }), process.isRunning else {
            let log = ["redis.log", "stderr.log"].map { (try? String(contentsOf: directory.appendingPathComponent($0), encoding: .utf8)) ?? "" }.joined()
            throw TestSupportError("redis-server in \(namespace.name) did not answer PING; log:\n\(log.suffix(2000))")
        }
        return socketPath
    }

    private func redisCLI(_ socketPath: String, _ arguments: [String]) throws -> String {
        let result = try runTool("redis-cli", ["-s", socketPath] + arguments, timeout: 10)
        guard result.exitCode == 0 else { throw TestSupportError("redis-cli: \(result.stderr)") }
        return result.stdout.trimmingCharacters(in: .newlines)
    }

    private func importTokens(socketPath: String) throws {
        var importConfig = config()
        importConfig["tokens"] = ["redis": ["url": "unix://\(socketPath)", "key": key], "file": NSNull()] as [String: Any]
        let configURL = workDir.appendingPathComponent("import-config.json")
        try JSONSerialization.data(withJSONObject: importConfig).write(to: configURL)
        let result = try TokenRelayProcess.runCommand(arguments: ["token", "import", "--config", configURL.path, "--from", tokenFileURL.path],
                                                      environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret])
        XCTAssertEqual(result.exitCode, 0, result.stderr)
    }

    /// A relay inside `namespace`: the token server and API mirrored onto that host's loopback at their
    /// own port numbers (so the base config's URLs hold), its proxy and admin listeners mirrored back onto
    /// the test's loopback. Returns a handle whose ports are the mirrored ones.
    private func startHostRelay(in namespace: NetworkNamespace, redisAddress: String) throws -> HostRelay {
        for port in [tokenServer.port, api.port] {
            try bridge(NamespaceBridge(listenIn: namespace, listenPort: port, connectIn: nil, connectPort: port))
        }
        let relay = try startRelay(["tokens": ["redis": ["url": "redis://\(redisAddress):6379/0", "key": key, "command_timeout_seconds": 0.5,
                                                         "poll_interval_seconds": 0.1] as [String: Any],
                                               "file": NSNull(), "watch_interval_seconds": 0.2] as [String: Any],
                                    "timeouts": ["refresh_seconds": 2, "hold_seconds": 15]],
                                   subdirectory: "host-\(namespace.name)",
                                   wrapper: namespace.wrapper([try TokenRelayProcess.binaryURL().path]))
        addTeardownBlock { relay.stop() }
        let proxy = try bridge(NamespaceBridge(listenIn: nil, connectIn: namespace, connectPort: relay.proxyPort))
        let admin = try bridge(NamespaceBridge(listenIn: nil, connectIn: namespace, connectPort: relay.adminPort))
        let host = HostRelay(process: relay, proxyPort: proxy.port, adminPort: admin.port)
        XCTAssertTrue(waitUntil(timeout: 15) { (try? self.admin(host, "/readyz").status) == 200 },
                      "relay in \(namespace.name) not ready: \(relay.stderrText.suffix(2000))")
        return host
    }

    @discardableResult
    private func bridge(_ bridge: NamespaceBridge) -> NamespaceBridge {
        addTeardownBlock { bridge.stop() }
        return bridge
    }

    private struct HostRelay {
        let process: TokenRelayProcess
        let proxyPort: Int
        let adminPort: Int
        var stderrText: String { process.stderrText }
    }

    private func get(_ relay: HostRelay, _ path: String) throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: path)
    }

    private func admin(_ relay: HostRelay, _ path: String) throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: path)
    }

    private func storeField(_ relay: HostRelay, _ field: String) -> Any? {
        guard let body = try? admin(relay, "/status").body,
              let status = try? JSONSerialization.jsonObject(with: body) as? [String: Any] else { return nil }
        return (status["token_store"] as? [String: Any])?[field]
    }
}
