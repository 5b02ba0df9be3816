import Foundation
import XCTest

/// Shared setup for black-box tests: a fake token endpoint with rotation and reuse detection, a fake
/// API that accepts only the token endpoint's current access token, a private token file, and the real
/// `tokenrelay` binary started against them.
class RelayTestCase: XCTestCase {
    static let clientSecret = "canary-client-secret-7f3a9c"
    var tokenServer: FakeTokenServer!
    var api: FakeAPIServer!
    var workDir: URL!
    var tokenFileURL: URL { workDir.appendingPathComponent("tokens.json") }
    private var relays: [TokenRelayProcess] = []
    private var rawUpstreams: [RawUpstream] = []

    /// Overridden by tests that need another lifetime (nil: the tokens never expire by themselves).
    var accessTokenLifetime: Double? { 3600 }

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory()
        tokenServer = try FakeTokenServer(clientID: "legacy-app", clientSecret: Self.clientSecret,
                                          accessTokenLifetime: accessTokenLifetime, expectedClientAuth: .basic)
        api = try FakeAPIServer(tokenServer: tokenServer)
        let tokens = tokenServer.issueInitialTokens()
        try writeTokenFile(at: tokenFileURL, access: tokens.access, refresh: tokens.refresh)
    }

    override func tearDownWithError() throws {
        relays.forEach { $0.stop() }
        // A failed test shows the end of each relay's log: CI keeps nothing else of the work directory.
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0 {
            for relay in relays {
                let log = (try? String(contentsOf: relay.workDir.appendingPathComponent("stderr.log"), encoding: .utf8)) ?? ""
                print("--- relay log (\(relay.workDir.lastPathComponent)), last 30 lines:\n" + log.split(separator: "\n").suffix(30).joined(separator: "\n"))
            }
        }
        relays = []
        rawUpstreams.forEach { $0.stop() }
        rawUpstreams = []
        api?.stop()
        tokenServer?.stop()
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    func config(_ overrides: [String: Any] = [:]) -> [String: Any] {
        var config: [String: Any] = [
            "listen": "127.0.0.1:0",
            "upstream": ["url": api.baseURL],
            "tokens": ["file": tokenFileURL.path, "watch_interval_seconds": 0.2],
            "refresh": ["grant": "refresh_token", "token_url": tokenServer.tokenURL, "client_id": "legacy-app",
                        "client_secret_env": "TOKENRELAY_CLIENT_SECRET", "client_auth": "client_secret_basic",
                        "backoff_seconds": 0.05],
            "admin": ["listen": "127.0.0.1:0"],
            "log": ["level": "debug"],
        ]
        for (key, value) in overrides {
            if let nested = value as? [String: Any], var existing = config[key] as? [String: Any] {
                existing.merge(nested) { _, new in new }
                config[key] = existing
            } else {
                config[key] = value
            }
        }
        return config
    }

    @discardableResult
    func startRelay(_ overrides: [String: Any] = [:], subdirectory: String = "relay", wrapper: [String] = [],
                    startupTimeout: Double = 15, environment: [String: String] = [:]) throws -> TokenRelayProcess {
        let directory = workDir.appendingPathComponent("\(subdirectory)-\(relays.count)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let relay = try TokenRelayProcess.start(config: config(overrides), environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret].merging(environment) { $1 },
                                                workDir: directory, wrapper: wrapper, startupTimeout: startupTimeout)
        relays.append(relay)
        return relay
    }

    /// An upstream driven byte by byte by `handler` (for responses MiniHTTPServer cannot produce),
    /// stopped in tearDown.
    func rawUpstream(backlog: Int32 = 512, accepting: Bool = true, _ handler: @escaping RawUpstream.Handler) throws -> RawUpstream {
        let upstream = try RawUpstream(backlog: backlog, accepting: accepting, handler: handler)
        rawUpstreams.append(upstream)
        return upstream
    }

    func get(_ relay: TokenRelayProcess, _ path: String = "/resource", headers: [(String, String)] = []) throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: path, headers: headers)
    }

    func admin(_ relay: TokenRelayProcess, _ path: String, method: String = "GET") throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.adminPort, method: method, path: path)
    }

    /// Sends `count` requests at once and returns their responses (failing the test on transport errors).
    func burst(_ count: Int, _ send: @escaping @Sendable (Int) throws -> TestHTTPResponse,
               file: StaticString = #filePath, line: UInt = #line) -> [TestHTTPResponse] {
        HTTPTestClient.concurrently(count, send).compactMap { result in
            switch result {
            case .success(let response): return response
            case .failure(let error):
                XCTFail("request failed: \(error)", file: file, line: line)
                return nil
            }
        }
    }

    /// Drives `relay` into "login required": the token endpoint refuses, the access token dies, one
    /// request gets 401 and readiness drops.
    func latchLoginRequired(_ relay: TokenRelayProcess, file: StaticString = #filePath, line: UInt = #line) throws {
        tokenServer.failureMode = .rejectAll
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay).status, 401, file: file, line: line)
        XCTAssertEqual(try admin(relay, "/readyz").status, 503, "login required", file: file, line: line)
    }

    /// Sends a request to /slow that leaves with the current token and is answered after a delay; while
    /// it waits, the token dies and a request to /fast causes a refresh. The upstream checks the slow
    /// request's token only when it answers, so its 401 belongs to an older generation.
    func requestSpanningARefresh(_ relay: TokenRelayProcess) throws -> AsyncCall<TestHTTPResponse> {
        api.responseDelay = 1.0
        let slow = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/slow") }
        XCTAssertTrue(waitUntil(timeout: 5) { self.api.requestCount == 1 })
        api.responseDelay = 0
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/fast").status, 200)
        return slow
    }

    func statusCounts(_ responses: [TestHTTPResponse]) -> [Int: Int] {
        Dictionary(grouping: responses, by: \.status).mapValues(\.count)
    }

    func readTokenFile() throws -> [String: Any] {
        let data = try Data(contentsOf: tokenFileURL)
        return try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    func fileMode(_ url: URL) throws -> Int {
        try XCTUnwrap(FileManager.default.attributesOfItem(atPath: url.path)[.posixPermissions] as? Int)
    }
}
