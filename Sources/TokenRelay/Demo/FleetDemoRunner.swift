import FoundationEssentials
import Glibc
import Glibc
import Logging

/// `tokenrelay demo --fleet`: three relays sharing one identity through a local redis-server (started
/// here on a private unix socket), in front of the demo API and token server. Every few seconds each relay
/// gets a burst; the token expires every 2 s, and the whole fleet refreshes once per expiry: one relay
/// presents the refresh token, the others adopt what it published.
public enum FleetDemoRunner {
    public struct Unavailable: Error, CustomStringConvertible {
        public let description: String
    }

    static let relayCount = 3

    public static func run(seconds: Double?, redactor: SecretRedactor, logger: Logger) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tokenrelay-fleet-demo-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let redis = try startRedis(directory: directory)
        defer {
            redis.terminate()
            redis.waitUntilExit()
        }
        let endpoint = RedisEndpoint(address: .unix(path: "\(directory)/redis.sock"))

        let loop = try EventLoop()
        let tokenServer = try DemoTokenServer(loop: loop, accessTokenLifetime: 2)
        let api = try DemoAPI(loop: loop, tokenServer: tokenServer)
        let initial = tokenServer.issueInitialTokens()
        let settings = RedisSettings(endpoint: endpoint, key: "tokenrelay:demo")
        _ = try RedisTokenCLI.store(TokenSet(accessToken: initial.access, refreshToken: initial.refresh,
                                             expiresAt: Date(timeIntervalSinceNow: tokenServer.accessTokenLifetime)),
                                    endpoint: endpoint, settings: settings)
        let secretPath = "\(directory)/client-secret"
        _ = FileManager.default.createFile(atPath: secretPath, contents: Data("demo-client-secret\n".utf8), attributes: [.posixPermissions: 0o600])

        let relays = try (0..<relayCount).map { _ in
            try makeRelay(loop: loop, api: api, tokenServer: tokenServer, socket: "\(directory)/redis.sock", secretPath: secretPath,
                          redactor: redactor, logger: logger)
        }
        relays[0].installSignalHandlers()
        relays.forEach { $0.announce() }
        tokenServer.onEvent = { say("demo \($0)") }
        var traffics: [DemoTraffic] = []
        for (index, relay) in relays.enumerated() {
            let traffic = DemoTraffic(loop: loop, proxyPort: relay.proxyPort, burstSize: 4)
            traffic.onBurstFinished = { burst, statuses in
                let counts = Dictionary(grouping: statuses, by: { $0 }).sorted { $0.key < $1.key }.map { "\($0.value.count)×\($0.key)" }
                say("demo fleet relay \(index + 1) burst \(burst): 4 requests → \(counts.joined(separator: ", ")); "
                    + "refreshes fleet-wide: \(tokenServer.refreshCount), reuse detected: \(tokenServer.reuseDetections)")
            }
            traffic.start(every: 2.5 + 0.1 * Double(index))
            traffics.append(traffic)
        }
        say("""
        tokenrelay demo --fleet: \(relayCount) relays share one identity in Redis (\(endpoint.description), key tokenrelay:demo);
        API \(api.url), token server \(tokenServer.url) (2-second access tokens, rotating refresh tokens, reuse detection)
        \(relays.enumerated().map { "relay \($0.offset + 1): curl -i http://127.0.0.1:\($0.element.proxyPort)/hello   status: curl http://127.0.0.1:\($0.element.adminPort ?? 0)/status" }.joined(separator: "\n"))
        Each relay gets a burst every ~2.5 s; per expiry the fleet refreshes once, the other relays adopt. Ctrl-C to stop.
        """)
        var stopTimer: LoopEvent?
        if let seconds {
            stopTimer = LoopEvent(loop: loop) { _ in loop.stop() }
            stopTimer?.schedule(after: seconds)
        }
        loop.run()
        traffics.forEach { $0.stop() }
        relays.forEach { $0.close() }
        withExtendedLifetime((api, stopTimer)) {}
    }

    private static func startRedis(directory: String) throws -> ChildProcess {
        let process: ChildProcess
        do {
            process = try ChildProcess(program: "redis-server", arguments: [
                "--port", "0", "--unixsocket", "\(directory)/redis.sock", "--unixsocketperm", "700",
                "--save", "", "--appendonly", "no", "--dir", directory, "--logfile", "\(directory)/redis.log"])
        } catch {
            throw Unavailable(description: "demo --fleet needs redis-server (apt-get install redis-server): \(error)")
        }
        let deadline = Date(timeIntervalSinceNow: 10)
        while !FileManager.default.fileExists(atPath: "\(directory)/redis.sock") {
            guard process.isRunning, Date() < deadline else {
                if process.isRunning { process.terminate() }
                throw Unavailable(description: "demo --fleet needs redis-server (apt-get install redis-server); it did not start")
            }
            usleep(20_000)
        }
        return process
    }

    private static func makeRelay(loop: EventLoop, api: DemoAPI, tokenServer: DemoTokenServer, socket: String, secretPath: String,
                                  redactor: SecretRedactor, logger: Logger) throws -> Relay {
        let json: [String: Any] = [
            "listen": "127.0.0.1:0",
            "upstream": ["url": api.url],
            "tokens": ["redis": ["url": "unix://\(socket)", "key": "tokenrelay:demo"]],
            "refresh": ["grant": "refresh_token", "token_url": tokenServer.url, "client_id": "demo-app",
                        "client_secret_file": secretPath, "client_auth": "client_secret_basic", "proactive": false,
                        // A refresh every few seconds is the demo's point, not a storm (see DemoRunner).
                        "storm_max_refreshes": 1000],
            "admin": ["listen": "127.0.0.1:0"],
        ]
        let config = try ConfigLoader.parse(Data(try JSONWriter.data(json)), source: "demo config")
        return try Relay(loop: loop, preflight: try Preflight.run(config: config), redactor: redactor, logger: logger)
    }

    private static func say(_ line: String) {
        StandardStreams.writeOut(line + "\n")
    }
}
