import FoundationEssentials
import Glibc
import Logging

/// `tokenrelay demo`: tokenrelay in front of a built-in API and token server, all on 127.0.0.1, with
/// 2-second access tokens so that expiry, a coalesced refresh and replays happen every few seconds.
public enum DemoRunner {
    public static func run(seconds: Double?, redactor: SecretRedactor, logger: Logger) throws {
        let loop = try EventLoop()
        let tokenServer = try DemoTokenServer(loop: loop, accessTokenLifetime: 2)
        let api = try DemoAPI(loop: loop, tokenServer: tokenServer)

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tokenrelay-demo-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let initial = tokenServer.issueInitialTokens()
        let tokenFile = TokenFile(path: "\(directory)/tokens.json")
        try tokenFile.write(TokenSet(accessToken: initial.access, refreshToken: initial.refresh,
                                     expiresAt: Date(timeIntervalSinceNow: tokenServer.accessTokenLifetime)))
        let secretPath = "\(directory)/client-secret"
        _ = FileManager.default.createFile(atPath: secretPath, contents: Data("demo-client-secret\n".utf8), attributes: [.posixPermissions: 0o600])

        let relay = try makeRelay(loop: loop, listenPort: 8080, api: api, tokenServer: tokenServer, directory: directory,
                                  secretPath: secretPath, redactor: redactor, logger: logger)
            ?? makeRelay(loop: loop, listenPort: 0, api: api, tokenServer: tokenServer, directory: directory,
                         secretPath: secretPath, redactor: redactor, logger: logger)!
        relay.installSignalHandlers()
        relay.announce()

        tokenServer.onEvent = { say("demo \($0)") }
        let traffic = DemoTraffic(loop: loop, proxyPort: relay.proxyPort, burstSize: 8)
        traffic.onBurstFinished = { burst, statuses in
            let counts = Dictionary(grouping: statuses, by: { $0 }).sorted { $0.key < $1.key }.map { "\($0.value.count)×\($0.key)" }
            say("demo burst \(burst): 8 concurrent requests through tokenrelay → \(counts.joined(separator: ", ")); "
                  + "API 401s so far: \(api.unauthorizedCount), refreshes: \(tokenServer.refreshCount), reuse detected: \(tokenServer.reuseDetections)")
        }
        traffic.start(every: 2.5)

        say("""
        tokenrelay demo: API \(api.url), token server \(tokenServer.url) (2-second access tokens, rotating refresh tokens, reuse detection)
        try it:  curl -i http://127.0.0.1:\(relay.proxyPort)/hello      (no token needed: tokenrelay injects it)
        status:  curl http://127.0.0.1:\(relay.adminPort ?? 0)/status
        Every 2.5 s the demo sends 8 requests at once; when the token has expired they all get 401 from the API,
        tokenrelay refreshes once and replays them. Ctrl-C to stop.
        """)
        var stopTimer: LoopEvent?
        if let seconds {
            stopTimer = LoopEvent(loop: loop) { _ in relay.shutdown(signal: SIGTERM) }
            stopTimer?.schedule(after: seconds)
        }
        loop.run()
        traffic.stop()
        relay.close()
        withExtendedLifetime((api, stopTimer)) {}
    }

    /// Unbuffered, so the demo's lines interleave correctly with the log lines on stderr.
    private static func say(_ line: String) {
        StandardStreams.writeOut(line + "\n")
    }

    private static func makeRelay(loop: EventLoop, listenPort: Int, api: DemoAPI, tokenServer: DemoTokenServer, directory: String,
                                  secretPath: String, redactor: SecretRedactor, logger: Logger) throws -> Relay? {
        let json: [String: Any] = [
            "listen": "127.0.0.1:\(listenPort)",
            "upstream": ["url": api.url],
            "tokens": ["file": "\(directory)/tokens.json"],
            "refresh": ["grant": "refresh_token", "token_url": tokenServer.url, "client_id": "demo-app",
                        "client_secret_file": secretPath, "client_auth": "client_secret_basic",
                        // Off so that the demo shows the 401 path; in production proactive refresh makes it rare.
                        "proactive": false,
                        // The demo's 2-second tokens make a refresh every burst, 12 in 30 s: the storm guard
                        // (5 in 30 s by default, meant for an API that keeps refusing fresh tokens) would stop
                        // the demo after its fifth burst.
                        "storm_max_refreshes": 1000],
            "admin": ["listen": "127.0.0.1:\(listenPort == 0 ? 0 : listenPort + 1)"],
        ]
        let config = try ConfigLoader.parse(Data(try JSONWriter.data(json)), source: "demo config")
        do {
            return try Relay(loop: loop, preflight: try Preflight.run(config: config), redactor: redactor, logger: logger)
        } catch is HTTPListener.BindError where listenPort != 0 {
            return nil
        }
    }
}
