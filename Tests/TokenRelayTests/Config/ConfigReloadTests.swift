import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// SIGHUP on the real binary: the config file and the client secret are read again, validated as
/// `check` validates them, and applied without touching connections, requests in flight or held
/// requests; what cannot change live is named and kept.
final class ConfigReloadTests: ReloadTestCase {
    private func metric(_ relay: TokenRelayProcess, _ series: String) throws -> String? {
        try admin(relay, "/metrics").bodyText.split(separator: "\n").first { $0.hasPrefix(series + " ") }
            .map { String($0.dropFirst(series.count + 1)) }
    }

    /// The new upstream takes the next request; a request held for a refresh across the reload is
    /// answered, and replayed to the upstream it was first sent to (its target was mapped for that one).
    func testNewUpstreamForNextRequestWhileHeldRequestKeepsItsOwn() throws {
        let other = try secondAPI()
        let relay = try startRelay(["upstream": ["url": api.baseURL], "timeouts": ["hold_seconds": 20]])
        XCTAssertEqual(try get(relay, "/before").status, 200)
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/held") }
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 1 }, "the 401 started a refresh, which the token server holds")
        XCTAssertEqual(try admin(relay, "/status").json()?["held_requests"] as? Int, 1, "the request is held")

        try reload(relay, ["upstream": ["url": other.baseURL]])
        XCTAssertTrue(relay.stderrText.contains("msg=\"config reloaded\""), relay.stderrText)
        XCTAssertEqual(try admin(relay, "/status").json()?["held_requests"] as? Int, 1, "still held after the reload")

        tokenServer.failureMode = .normal
        tokenServer.openGate()
        let answer = try held.wait(timeout: 20)
        XCTAssertEqual(answer.status, 200, answer.bodyText)
        XCTAssertEqual(api.requests.map(\.path), ["/before", "/held", "/held"], "sent, refused with 401, replayed: all to the first upstream")

        XCTAssertEqual(try get(relay, "/next").status, 200)
        XCTAssertEqual(other.requests.map(\.path), ["/next"], "the next request goes to the new upstream")
        XCTAssertFalse(api.requests.map(\.path).contains("/next"))
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        XCTAssertEqual(try metric(relay, "tokenrelay_config_reloads_total{outcome=\"applied\"}"), "1")
    }

    /// An open keep-alive client connection survives the reload; its next request goes to the new upstream.
    func testClientConnectionSurvivesTheReload() throws {
        let other = try secondAPI()
        let relay = try startRelay()
        let connection = try HTTPTestConnection(port: relay.proxyPort)
        defer { connection.close() }
        XCTAssertEqual(try connection.send(method: "GET", path: "/first").status, 200)
        try reload(relay, ["upstream": ["url": other.baseURL]])
        XCTAssertFalse(connection.peerClosed, "the reload closed no client connection")
        XCTAssertEqual(try connection.send(method: "GET", path: "/second").status, 200)
        XCTAssertEqual(api.requests.map(\.path), ["/first"])
        XCTAssertEqual(other.requests.map(\.path), ["/second"])
    }

    /// A response streaming from the old upstream keeps flowing to its end after the reload.
    func testStreamInFlightIsUnaffected() throws {
        let releaseRest = DispatchSemaphore(value: 0)
        let streaming = try rawUpstream { connection in
            while let request = try connection.readRequest() {
                guard request.path == "/stream" else {
                    try connection.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                }
                try connection.write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
                try connection.writeChunk("first")
                _ = releaseRest.wait(timeout: .now() + 20)
                try connection.writeChunk("second")
                try connection.write("0\r\n\r\n")
            }
        }
        let relay = try startRelay(["upstream": ["url": streaming.baseURL]])
        let client = try StreamingClient(port: relay.proxyPort, timeout: 20)
        defer { client.close() }
        try client.get("/stream", port: relay.proxyPort)
        XCTAssertEqual(client.status, 200)
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "first")

        try reload(relay, ["upstream": ["url": api.baseURL]])
        releaseRest.signal()
        XCTAssertEqual(try client.readChunk().map { String(decoding: $0, as: UTF8.self) }, "second")
        XCTAssertNil(try client.readChunk(), "the chunked body ends with its final chunk")

        XCTAssertEqual(try get(relay, "/after").status, 200)
        XCTAssertEqual(api.requests.map(\.path), ["/after"], "new requests go to the new upstream")
    }

    /// An invalid config changes nothing: one line names the field, the old config keeps serving, the
    /// failure is counted.
    func testInvalidConfigKeepsTheRunningOne() throws {
        let other = try secondAPI()
        let relay = try startRelay()
        var broken = config(["upstream": ["url": other.baseURL]])
        var refresh = broken["refresh"] as! [String: Any]
        refresh["clinet_id"] = refresh.removeValue(forKey: "client_id")
        broken["refresh"] = refresh
        try reload(relay, config: broken)
        let failures = relay.stderrText.split(separator: "\n").filter { $0.contains("config reload failed") }
        XCTAssertEqual(failures.count, 1, relay.stderrText)
        XCTAssertTrue(failures.first?.contains("refresh.clinet_id: unknown key (did you mean client_id?)") == true, "\(failures)")
        XCTAssertEqual(try get(relay, "/still").status, 200)
        XCTAssertEqual(api.requests.map(\.path), ["/still"], "the running upstream stays")
        XCTAssertEqual(other.requestCount, 0, "nothing of the invalid config was applied")
        XCTAssertEqual(try metric(relay, "tokenrelay_config_reloads_total{outcome=\"invalid\"}"), "1")

        // A later valid reload applies.
        try reload(relay, ["upstream": ["url": other.baseURL]])
        XCTAssertEqual(try get(relay, "/fixed").status, 200)
        XCTAssertEqual(other.requests.map(\.path), ["/fixed"])
    }

    /// A changed listen address is refused with a line saying a restart is needed; the listener stays
    /// where it is, and the rest of the reload applies.
    func testListenerChangeNeedsARestart() throws {
        let other = try secondAPI()
        let relay = try startRelay()
        try reload(relay, ["listen": "127.0.0.1:1", "upstream": ["url": other.baseURL]])
        let refusal = relay.stderrText.split(separator: "\n").filter { $0.contains("listen: changing it needs a restart") }
        XCTAssertEqual(refusal.count, 1, relay.stderrText)
        XCTAssertTrue(refusal.first?.contains("config file says 127.0.0.1:1") == true, "\(refusal)")
        XCTAssertEqual(try get(relay, "/same-port").status, 200, "still listening on the port it started on")
        XCTAssertEqual(other.requests.map(\.path), ["/same-port"], "the upstream change applied")
        XCTAssertEqual(try metric(relay, "tokenrelay_config_reloads_total{outcome=\"needs_restart\"}"), "1")
    }

    /// The injection format and the log level apply live.
    func testInjectionFormatAndLogLevelApply() throws {
        let relay = try startRelay()
        XCTAssertEqual(try get(relay, "/a").status, 200)
        let tokens = tokenServer!
        let headerAPI = stoppedInTearDown(try FakeAPIServer(validateToken: { tokens.isAccessTokenValid($0) }, tokenHeader: "X-Api-Token"))
        try reload(relay, ["upstream": ["url": headerAPI.baseURL], "inject": ["header": "X-Api-Token", "format": "{token}"],
                           "log": ["level": "warning"]])
        XCTAssertEqual(try get(relay, "/b").status, 200, "token sent in the new header")
        XCTAssertNil(headerAPI.requests.first?.header("Authorization"))
        let linesBefore = relay.stderrText.split(separator: "\n").count
        XCTAssertEqual(try get(relay, "/c").status, 200)
        XCTAssertEqual(relay.stderrText.split(separator: "\n").count, linesBefore, "debug lines are off at level warning")
    }

    /// SIGUSR1 (what log-rotation hooks send) must not end the process: logs go to stderr, and it says so.
    func testSIGUSR1IsAnsweredNotFatal() throws {
        let relay = try startRelay()
        relay.signal(SIGUSR1)
        XCTAssertTrue(waitUntil(timeout: 10) { relay.stderrText.contains("SIGUSR1: logs go to stderr only") }, relay.stderrText)
        XCTAssertTrue(relay.isRunning)
        XCTAssertEqual(try get(relay).status, 200)
    }

    /// The client id in the Basic authorization of the token server's request number `index`.
    private func presentedClientID(_ index: Int) throws -> String {
        let requests = tokenServer.receivedRequests
        XCTAssertGreaterThan(requests.count, index)
        let value = try XCTUnwrap(requests[index].header("Authorization"))
        let pair = String(decoding: try XCTUnwrap(Data(base64Encoded: String(value.dropFirst("Basic ".count)))), as: UTF8.self)
        return FakeTokenServer.formDecode(pair.prefix { $0 != ":" })
    }

    /// A refresh in flight during a reload finishes with the settings it started with; the next refresh
    /// uses the new ones.
    func testRefreshInFlightFinishesWithItsSettings() throws {
        let relay = try startRelay(["timeouts": ["hold_seconds": 20]])
        tokenServer.failureMode = .gated
        tokenServer.expireAccessTokens()
        let held = HTTPTestClient.concurrentlyAsync { try HTTPTestClient.send(port: relay.proxyPort, method: "GET", path: "/held") }
        XCTAssertTrue(waitUntil(timeout: 10) { self.tokenServer.refreshCalls == 1 }, "a refresh is in flight")

        // The token server knows only legacy-app: a refresh with the new id would be refused.
        try reload(relay, ["refresh": ["client_id": "renamed-app"]])
        tokenServer.failureMode = .normal
        tokenServer.openGate()
        XCTAssertEqual(try held.wait(timeout: 20).status, 200, "the refresh in flight completed with the old client id")
        XCTAssertEqual(try presentedClientID(0), "legacy-app")

        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/later").status, 401, "the next refresh used the new client id and was refused")
        XCTAssertEqual(tokenServer.refreshCalls, 2)
        XCTAssertEqual(try presentedClientID(1), "renamed-app")
    }

    /// A reloaded refresh_seconds governs the hold-off as well as the connection: with the old, shorter
    /// one the hold-off ended before the reloaded timeout had even run out, and the refresh token left
    /// again while the server was still working on the first presentation.
    func testReloadedRefreshTimeoutGovernsTheHoldOff() throws {
        let relay = try startRelay(["timeouts": ["refresh_seconds": 0.3], "refresh": ["backoff_seconds": 0.05]])
        try reload(relay, ["timeouts": ["refresh_seconds": 1.5], "refresh": ["backoff_seconds": 0.05]])
        tokenServer.failureMode = .delay(3)
        tokenServer.expireAccessTokens()
        XCTAssertEqual(try get(relay, "/first").status, 503, "the exchange timed out at 1.5 s: outcome unknown")
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        // The hold-off runs at least 1.5 s from sending; under the stale 0.3 s it would be over already.
        XCTAssertEqual(try get(relay, "/during-hold-off").status, 503)
        XCTAssertEqual(tokenServer.refreshCalls, 1, "the refresh token was presented again inside the hold-off")
    }
}
