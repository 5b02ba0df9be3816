import Foundation
import TLSFixtures
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// SIGHUP reads the new config off the event loop. To hold a reload in its preparation for as long as a
/// test needs, the reloaded config names a FIFO as the token endpoint's CA bundle (`refresh.tls.ca_file`):
/// OpenSSL's open of it blocks until the test opens the other end, and the test knows the preparation is
/// there once its own non-blocking open for writing succeeds (a FIFO has a reader). Writing a CA
/// certificate and closing that end lets the preparation finish with a valid config.
final class ReloadPreparationTests: ReloadTestCase {
    /// A config whose token endpoint's CA bundle is the FIFO at `path`.
    private func configReadingCA(from path: String, _ overrides: [String: Any]) -> [String: Any] {
        var object = config(overrides)
        var refresh = object["refresh"] as! [String: Any]
        refresh["token_url"] = "https://127.0.0.1:1/token"
        refresh["tls"] = ["ca_file": path]
        object["refresh"] = refresh
        return object
    }

    private func makeFIFO() throws -> String {
        let path = workDir.appendingPathComponent("ca.fifo").path
        guard mkfifo(path, 0o600) == 0 else { throw TestSupportError(errnoContext: "mkfifo") }
        return path
    }

    /// Waits until the relay is blocked reading the FIFO, returning the write end.
    private func awaitReader(_ path: String, _ relay: TokenRelayProcess, file: StaticString = #filePath, line: UInt = #line) throws -> Int32 {
        var writer: Int32 = -1
        XCTAssertTrue(waitUntil(timeout: 10) {
            writer = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            return writer >= 0
        }, "the reload never started reading the CA bundle: \(relay.stderrText)", file: file, line: line)
        guard writer >= 0 else { throw TestSupportError("no reader on \(path)") }
        return writer
    }

    /// Hands the blocked preparation a valid CA bundle and lets it finish (end of file).
    private func release(_ writer: Int32) throws {
        let bytes = [UInt8](try Data(contentsOf: TestPKI.shared().caFile))
        XCTAssertEqual(bytes.withUnsafeBytes { Glibc.write(writer, $0.baseAddress, $0.count) }, bytes.count)
        close(writer)
    }

    private func lines(_ relay: TokenRelayProcess, containing text: String) -> [Substring] {
        relay.stderrText.split(separator: "\n").filter { $0.contains(text) }
    }

    /// While a reload is being prepared the proxy answers; a second SIGHUP meanwhile makes the first
    /// preparation's result (read before the second edit) be dropped and the config read again, so the
    /// newest config wins. systemd hears RELOADING=1 for each preparation and READY=1 once, at the end.
    func testSecondSIGHUPDuringPreparationWinsAndTheLoopKeepsServing() throws {
        let fifo = try makeFIFO()
        let firstEdit = try secondAPI(), secondEdit = try secondAPI()
        let socketPath = workDir.appendingPathComponent("notify.sock").path
        let receiver = try NotifyReceiver(path: socketPath)
        let relay = try TokenRelayProcess.start(
            config: config(), environment: ["TOKENRELAY_CLIENT_SECRET": Self.clientSecret, "NOTIFY_SOCKET": socketPath], workDir: workDir)
        defer { relay.stop() }
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("READY=1") }, "\(receiver.messages)")

        try writeConfig(configReadingCA(from: fifo, ["upstream": ["url": firstEdit.baseURL]]), to: relay.configURL)
        relay.signal(SIGHUP)
        let writer = try awaitReader(fifo, relay)

        // The preparation is blocked on the FIFO: the loop serves anyway, with the running config.
        XCTAssertEqual(try get(relay, "/during").status, 200)
        XCTAssertEqual(try admin(relay, "/healthz").status, 200)
        XCTAssertEqual(api.requests.map(\.path), ["/during"])
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.contains("RELOADING=1") }, "\(receiver.messages)")
        XCTAssertEqual(receiver.messages.filter { $0 == "READY=1" }.count, 1, "not ready again while the reload is prepared")

        try writeConfig(config(["upstream": ["url": secondEdit.baseURL]]), to: relay.configURL)
        relay.signal(SIGHUP)
        XCTAssertTrue(waitUntil(timeout: 10) { !self.lines(relay, containing: "SIGHUP while a reload is being prepared").isEmpty },
                      relay.stderrText)
        try release(writer)

        // READY=1 comes once, after the last preparation was applied.
        XCTAssertTrue(receiver.waitFor(timeout: 10) { $0.filter { $0 == "READY=1" }.count == 2 }, "\(receiver.messages)")
        XCTAssertEqual(lines(relay, containing: "config reload superseded by a later SIGHUP").count, 1, relay.stderrText)
        XCTAssertEqual(try get(relay, "/after").status, 200)
        XCTAssertEqual(secondEdit.requests.map(\.path), ["/after"], "the config after the second SIGHUP is in service")
        XCTAssertEqual(firstEdit.requestCount, 0, "the superseded config (valid, read before the second edit) was never applied")
        XCTAssertEqual(lines(relay, containing: "msg=\"config reloaded\"").count, 1, relay.stderrText)
        let metrics = try admin(relay, "/metrics").bodyText
        XCTAssertTrue(metrics.contains("tokenrelay_config_reloads_total{outcome=\"applied\"} 1"), metrics)

        let messages = receiver.messages
        XCTAssertEqual(messages.filter { $0 == "RELOADING=1" }.count, 2, "one per preparation: \(messages)")
        XCTAssertGreaterThan(try XCTUnwrap(messages.lastIndex(of: "READY=1")), try XCTUnwrap(messages.lastIndex(of: "RELOADING=1")))
        relay.signal(SIGTERM)
        XCTAssertEqual(relay.waitForExit(timeout: 20), 0, relay.stderrText)
    }

    /// A shutdown that begins while a reload is being prepared: the drain runs with the config it began
    /// with, and the prepared config is dropped, not applied halfway through the drain.
    func testShutdownDuringPreparationDropsTheReload() throws {
        let fifo = try makeFIFO()
        let other = try secondAPI()
        let arrived = DispatchSemaphore(value: 0), answerSlow = DispatchSemaphore(value: 0)
        let slow = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                if request.path == "/slow" {
                    arrived.signal()
                    _ = answerSlow.wait(timeout: .now() + 20)
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            }
        }
        let relay = try startRelay(["upstream": ["url": slow.baseURL]])
        try writeConfig(configReadingCA(from: fifo, ["upstream": ["url": other.baseURL]]), to: relay.configURL)
        relay.signal(SIGHUP)
        let writer = try awaitReader(fifo, relay)

        let inFlight = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/slow") }
        XCTAssertEqual(arrived.wait(timeout: .now() + 10), .success, "the request reached the upstream")
        relay.signal(SIGTERM)
        XCTAssertTrue(waitUntil(timeout: 10) { !self.lines(relay, containing: "shutting down").isEmpty }, relay.stderrText)
        try release(writer)
        XCTAssertTrue(waitUntil(timeout: 10) { !self.lines(relay, containing: "config reload abandoned: shutting down").isEmpty },
                      relay.stderrText)

        answerSlow.signal()
        XCTAssertEqual(try inFlight.wait(timeout: 20).status, 200, "the request in flight finished during the drain")
        XCTAssertEqual(relay.waitForExit(timeout: 20), 0, relay.stderrText)
        XCTAssertTrue(lines(relay, containing: "msg=\"config reloaded\"").isEmpty, relay.stderrText)
        XCTAssertEqual(other.requestCount, 0)
    }

    /// A preparation stuck on a file (a hung network file system) does not hold up the exit: the drain
    /// ends, the process exits 0, and the helper thread goes with it.
    func testAPreparationStuckOnAFileDoesNotHoldUpTheExit() throws {
        let fifo = try makeFIFO()
        let relay = try startRelay()
        try writeConfig(configReadingCA(from: fifo, [:]), to: relay.configURL)
        relay.signal(SIGHUP)
        let writer = try awaitReader(fifo, relay)
        defer { close(writer) }
        relay.signal(SIGTERM)
        XCTAssertEqual(relay.waitForExit(timeout: 10), 0, relay.stderrText)
        XCTAssertTrue(relay.stderrText.contains("drained; exiting"), relay.stderrText)
    }
}
