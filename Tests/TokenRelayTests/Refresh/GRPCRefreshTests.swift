import Foundation
import XCTest

/// gRPC's UNAUTHENTICATED end to end: grpcio clients through tokenrelay (h2c with prior knowledge) to a
/// grpcio server (h2c upstream) that checks every call's token with the rotating token server (reuse
/// detection on). The rule itself is the request machine's (`RequestLifecycleGRPCTests`).
final class GRPCRefreshTests: RelayTestCase {
    private var grpc: GRPCTestServer!

    override func tearDownWithError() throws {
        grpc?.stop()
        try super.tearDownWithError()
    }

    private func startGRPCRelay(maxConnectionAgeMilliseconds: Int? = nil, _ overrides: [String: Any] = [:]) throws -> TokenRelayProcess {
        grpc = try GRPCTestServer(tokenServer: tokenServer, workDir: workDir, maxConnectionAgeMilliseconds: maxConnectionAgeMilliseconds)
        return try startRelay(overrides.merging(["upstream": ["url": grpc.url, "http2": "prior_knowledge"]]) { $1 })
    }

    private func codes(_ outcome: [String: Any]) -> [String] { outcome["codes"] as? [String] ?? [] }

    /// The issue's burst: 50 unary calls at once after the token died. Each first answer is a Trailers-Only
    /// UNAUTHENTICATED; all 50 are held for one refresh and replayed once with the new token.
    func testABurstOf50UnaryCallsAfterTheTokenDiedAllSucceedWithOneRefresh() throws {
        let relay = try startGRPCRelay()
        XCTAssertEqual(codes(try grpc.client(port: relay.proxyPort, "burst", [1])), ["OK"], grpc.stderrText)
        tokenServer.expireAccessTokens()
        let outcome = try grpc.client(port: relay.proxyPort, "burst", [50])
        XCTAssertEqual(codes(outcome), Array(repeating: "OK", count: 50), "\(outcome)")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.refreshCalls, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        let refused = try grpc.count("unauthenticated", "Unary")
        XCTAssertGreaterThanOrEqual(refused, 1, "the refresh came from the server's UNAUTHENTICATED")
        XCTAssertEqual(try grpc.count("ok", "Unary"), 51)
        XCTAssertEqual(try grpc.count("calls", "Unary"), 51 + refused, "each refused call went again exactly once")
    }

    /// A client-streaming call whose messages were kept (under `limits.max_body_bytes`) is replayed whole.
    func testAClientStreamingCallIsReplayedWithAllItsMessages() throws {
        let relay = try startGRPCRelay()
        tokenServer.expireAccessTokens()
        let outcome = try grpc.client(port: relay.proxyPort, "collect", [5])
        XCTAssertEqual(outcome["code"] as? String, "OK", "\(outcome)")
        XCTAssertEqual((outcome["reply"] as? [String: Any])?["messages"] as? Int, 5)
        XCTAssertEqual((outcome["reply"] as? [String: Any])?["bytes"] as? Int, 500)
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(try grpc.count("calls", "Collect"), 2)
    }

    /// The refresh is refused (the refresh token is dead): the held call gets the server's own
    /// UNAUTHENTICATED, as captured (a Trailers-Only answer, its message intact), not a broken stream.
    /// tokenrelay's own answer to a gRPC call (here a 502: the upstream is gone) is a gRPC status with
    /// tokenrelay's message, not an HTTP error status the client turns into a status of its own.
    func testTheRelaysOwnAnswerToACallIsAGRPCStatusWithItsMessage() throws {
        let relay = try startGRPCRelay()
        XCTAssertEqual(codes(try grpc.client(port: relay.proxyPort, "burst", [1])), ["OK"], grpc.stderrText)
        grpc.stop()
        let outcome = try grpc.client(port: relay.proxyPort, "burst", [1])
        XCTAssertEqual(codes(outcome), ["UNAVAILABLE"], "\(outcome)")
        let details = (outcome["details"] as? [String])?.first ?? ""
        XCTAssertTrue(details.hasPrefix("tokenrelay: "), "the relay's reason reaches the caller: \(outcome)")
    }

    func testARefusedRefreshGivesTheCallTheServersUnauthenticated() throws {
        let relay = try startGRPCRelay()
        tokenServer.failureMode = .rejectAll
        tokenServer.expireAccessTokens()
        let outcome = try grpc.client(port: relay.proxyPort, "burst", [3])
        XCTAssertEqual(codes(outcome), Array(repeating: "UNAUTHENTICATED", count: 3), "\(outcome)")
        XCTAssertEqual(outcome["details"] as? [String], Array(repeating: "invalid or expired access token", count: 3))
        XCTAssertEqual(tokenServer.refreshCalls, 1, "one refresh for the three")
        XCTAssertEqual(try grpc.count("calls", "Unary"), 3, "none sent again")
    }

    /// A refusal sent as a response head and then trailers, with no message between (not Trailers-Only):
    /// the same rule (held, one refresh, replayed); and when the refresh is refused, the held calls get the
    /// server's status and message although they came in trailers (the captured answer carries them).
    func testARefusalInTrailersAfterAnEmptyHeadIsHandledAlike() throws {
        let relay = try startGRPCRelay()
        tokenServer.expireAccessTokens()
        let outcome = try grpc.client(port: relay.proxyPort, "late", [10])
        XCTAssertEqual(codes(outcome), Array(repeating: "OK", count: 10), "\(outcome)")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
        tokenServer.failureMode = .rejectAll
        tokenServer.expireAccessTokens()
        let refused = try grpc.client(port: relay.proxyPort, "late", [3])
        XCTAssertEqual(codes(refused), Array(repeating: "UNAUTHENTICATED", count: 3), "\(refused)")
        XCTAssertEqual(refused["details"] as? [String], Array(repeating: "invalid or expired access token", count: 3))
        XCTAssertEqual(tokenServer.refreshCalls, 2)
    }

    /// The replay-once guard: a server that refuses every token gets each call twice (the first send and one
    /// replay after the one refresh); the second UNAUTHENTICATED is the client's. No loop, no second refresh.
    func testASecondUnauthenticatedAfterTheReplayIsTheClients() throws {
        let relay = try startGRPCRelay()
        let outcome = try grpc.client(port: relay.proxyPort, "refuse", [4])
        XCTAssertEqual(codes(outcome), Array(repeating: "UNAUTHENTICATED", count: 4), "\(outcome)")
        XCTAssertEqual(outcome["details"] as? [String], Array(repeating: "refused whatever the token", count: 4))
        XCTAssertEqual(try grpc.count("calls", "Refuse"), 8, "each call sent twice, never more")
        XCTAssertEqual(tokenServer.successfulRefreshes, 1)
        XCTAssertEqual(tokenServer.reuseDetections, 0)
    }

    /// A server-streaming call that gets UNAUTHENTICATED after its first message: the client has seen that
    /// message, so the status is its answer, unchanged; the call is not sent again and nothing is refreshed.
    func testUnauthenticatedAfterAServerStreamsFirstMessageIsPassedToTheClient() throws {
        let relay = try startGRPCRelay()
        let outcome = try grpc.client(port: relay.proxyPort, "watch")
        XCTAssertEqual(outcome["messages"] as? [String], ["first"], "\(outcome)")
        XCTAssertEqual(outcome["code"] as? String, "UNAUTHENTICATED")
        XCTAssertEqual(outcome["details"] as? String, "token revoked mid-stream")
        XCTAssertEqual(try grpc.count("calls", "Watch"), 1, "no replay")
        XCTAssertEqual(tokenServer.refreshCalls, 0, "no refresh")
    }

    /// A server-streaming call whose first message takes longer than `timeouts.upstream_seconds` (a watch
    /// with nothing to report yet): its head is in, withheld, and the wait is bounded by
    /// `timeouts.stream_idle_seconds` instead; the call gets both messages and OK, not a 504.
    func testAFirstMessageSlowerThanTheHeadDeadlineStillArrives() throws {
        let relay = try startGRPCRelay(["timeouts": ["upstream_seconds": 0.5, "stream_idle_seconds": 30]])
        let outcome = try grpc.client(port: relay.proxyPort, "slow", [2000])
        XCTAssertEqual(outcome["messages"] as? [String], ["first", "second"], "\(outcome)")
        XCTAssertEqual(outcome["code"] as? String, "OK")
        XCTAssertEqual(try grpc.count("calls", "Slow"), 1)
        // The head came at once: its latency is that, not the 2 s wait for the first message after it.
        let metrics = try HTTPTestClient.send(port: relay.adminPort, method: "GET", path: "/metrics").bodyText
        let sum = metrics.split(separator: "\n").first { $0.hasPrefix("tokenrelay_upstream_response_seconds_sum ") }
            .flatMap { Double($0.split(separator: " ").last ?? "") }
        XCTAssertLessThan(try XCTUnwrap(sum, metrics), 1.5, "head latency, not the first message's wait")
    }

    /// The server ends each connection with GOAWAY at 300 ms of age while calls keep coming: every call
    /// still succeeds (those the server did not take go again on a new connection), across at least 3.
    func testGoawayFromTheServerMidBurstLosesNoCall() throws {
        let relay = try startGRPCRelay(maxConnectionAgeMilliseconds: 300)
        let outcome = try grpc.client(port: relay.proxyPort, "until_connections", [3, 4000], timeout: 180)
        let all = codes(outcome)
        let resent = relay.stderrText.components(separatedBy: "retrying on a fresh upstream connection").count - 1
        print("GOAWAY burst: \(all.count) calls over \(outcome["connections"] ?? "?") upstream connections, \(resent) sent again")
        XCTAssertGreaterThanOrEqual(outcome["connections"] as? Int ?? 0, 3, "GOAWAY came mid-burst: \(outcome["connections"] ?? "?") connections")
        XCTAssertEqual(all.filter { $0 != "OK" }, [], "every call answered OK")
        XCTAssertEqual(try grpc.count("ok", "Unary"), all.count)
        XCTAssertEqual(tokenServer.refreshCalls, 0)
    }
}
