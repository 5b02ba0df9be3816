import Foundation
import XCTest

/// Black-box tests of the credentials of issue 20: the real `tokenrelay` binary against
/// `AssertionTokenEndpoint` (which verifies what it is sent with an independent JOSE implementation) and a
/// fake API that accepts exactly the access tokens that endpoint issued.
class CredentialTestCase: XCTestCase {
    static let clientID = "relay-client"
    var workDir: URL!
    private(set) var endpoint: AssertionTokenEndpoint!
    private(set) var api: FakeAPIServer!
    private var relays: [TokenRelayProcess] = []
    var tokenFileURL: URL { workDir.appendingPathComponent("tokens.json") }

    override func setUpWithError() throws {
        workDir = makeTemporaryDirectory(prefix: "tokenrelay-creds")
    }

    override func tearDownWithError() throws {
        relays.forEach { $0.stop() }
        if let run = testRun, run.failureCount + run.unexpectedExceptionCount > 0 {
            for relay in relays {
                print("--- relay log, last 30 lines:\n" + relay.stderrText.split(separator: "\n").suffix(30).joined(separator: "\n"))
            }
            if let endpoint { print("--- token endpoint stderr:\n\(endpoint.stderrText.suffix(3000))") }
        }
        relays = []
        api?.stop()
        endpoint?.stop()
        if let workDir { try? FileManager.default.removeItem(at: workDir) }
    }

    /// Starts the token endpoint with `settings` (client_id and the audience default to the usual ones)
    /// and an API that asks it whether a token is current.
    @discardableResult
    func startEndpoint(_ settings: [String: Any]) throws -> AssertionTokenEndpoint {
        var settings = settings
        settings["client_id"] = settings["client_id"] ?? Self.clientID
        let endpoint = try AssertionTokenEndpoint(settings: settings, workDir: workDir)
        self.endpoint = endpoint
        api = try FakeAPIServer(validateToken: { endpoint.isValid($0) })
        return endpoint
    }

    /// A config with `refresh` merged over a token_url and client_id for the endpoint (NSNull removes a key).
    func relayConfig(refresh: [String: Any], tls: [String: Any]? = nil) -> [String: Any] {
        var refreshObject: [String: Any] = ["token_url": endpoint.tokenURL, "client_id": Self.clientID, "backoff_seconds": 0.05]
        refreshObject.merge(refresh) { _, new in new }
        for (key, value) in refreshObject where value is NSNull { refreshObject[key] = nil }
        if let tls { refreshObject["tls"] = tls }
        return [
            "listen": "127.0.0.1:0",
            "upstream": ["url": api.baseURL],
            "tokens": ["file": tokenFileURL.path, "watch_interval_seconds": 0.2],
            "refresh": refreshObject,
            "admin": ["listen": "127.0.0.1:0"],
            "log": ["level": "debug"],
        ]
    }

    /// tokenrelay with `relayConfig(refresh:tls:)`, no token file unless the test wrote one.
    @discardableResult
    func startRelay(refresh: [String: Any], tls: [String: Any]? = nil) throws -> TokenRelayProcess {
        let directory = workDir.appendingPathComponent("relay-\(relays.count)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let relay = try TokenRelayProcess.start(config: relayConfig(refresh: refresh, tls: tls), workDir: directory)
        relays.append(relay)
        return relay
    }

    func get(_ relay: TokenRelayProcess, _ path: String = "/resource") throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: path)
    }

    func admin(_ relay: TokenRelayProcess, _ path: String) throws -> TestHTTPResponse {
        try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: path)
    }

    /// Replaces `url`'s content in one rename, as the kubelet does with a projected token.
    func replaceFile(_ url: URL, with text: String) throws {
        let temporary = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).\(UUID().uuidString.prefix(6))")
        try Data(text.utf8).write(to: temporary)
        guard rename(temporary.path, url.path) == 0 else { throw TestSupportError(errnoContext: "rename") }
    }

    /// None of `secrets` (or their first 40 characters) in the relay's log, /status or /metrics.
    func assertNothingLeaks(_ relay: TokenRelayProcess, _ secrets: [String], file: StaticString = #filePath, line: UInt = #line) throws {
        let places = [("log", relay.stderrText + relay.stdoutText), ("/status", try admin(relay, "/status").bodyText),
                      ("/metrics", try admin(relay, "/metrics").bodyText)]
        for secret in secrets where !secret.isEmpty {
            for (place, text) in places {
                XCTAssertFalse(text.contains(secret.prefix(40)), "a secret (\(secret.prefix(6))…) reached \(place)", file: file, line: line)
            }
        }
    }

    /// The base64 body lines of a PEM file (what a leaked key would look like).
    func pemBodyLines(_ url: URL) throws -> [String] {
        try String(contentsOf: url, encoding: .utf8).split(separator: "\n").filter { !$0.hasPrefix("-----") }.map(String.init)
    }
}
