import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// What the SIGHUP tests share: extra upstreams to move the relay to, rewriting its config file, and
/// sending SIGHUP with a wait for the reload's outcome line.
class ReloadTestCase: RelayTestCase {
    private var extraAPIs: [FakeAPIServer] = []

    override func tearDownWithError() throws {
        try super.tearDownWithError()
        extraAPIs.forEach { $0.stop() }
        extraAPIs = []
    }

    /// A second upstream that accepts the same tokens (stopped in tearDown).
    func secondAPI() throws -> FakeAPIServer {
        stoppedInTearDown(try FakeAPIServer(tokenServer: tokenServer))
    }

    func stoppedInTearDown(_ api: FakeAPIServer) -> FakeAPIServer {
        extraAPIs.append(api)
        return api
    }

    /// Replaces the config file atomically, as an editor or a config manager does.
    func writeConfig(_ object: [String: Any], to url: URL) throws {
        try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]).write(to: url, options: .atomic)
    }

    /// Reload outcome lines logged so far (applied or failed).
    func reloadCount(_ relay: TokenRelayProcess) -> Int {
        let text = relay.stderrText
        return text.components(separatedBy: "msg=\"config reloaded\"").count + text.components(separatedBy: "msg=\"config reload failed").count - 2
    }

    /// Rewrites the relay's config file, sends SIGHUP and waits for the reload's outcome line.
    func reload(_ relay: TokenRelayProcess, _ overrides: [String: Any], file: StaticString = #filePath, line: UInt = #line) throws {
        try reload(relay, config: config(overrides), file: file, line: line)
    }

    func reload(_ relay: TokenRelayProcess, config object: [String: Any], file: StaticString = #filePath, line: UInt = #line) throws {
        let before = reloadCount(relay)
        try writeConfig(object, to: relay.configURL)
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { self.reloadCount(relay) > before }, "no reload outcome logged: \(relay.stderrText)",
                      file: file, line: line)
        XCTAssertTrue(relay.isRunning, "SIGHUP must not end the process", file: file, line: line)
    }
}
