import Foundation
import Glibc
import HTTPTransport
import TLSFixtures
import XCTest

/// The one-shot request (`HTTPExchange`): a whole response or exactly one failure that says what went
/// wrong, within its deadline.
final class HTTPExchangeTests: LoopThreadTestCase {
    private final class Outcome: @unchecked Sendable {
        private let lock = NSLock()
        let signal = DispatchSemaphore(value: 0)
        private var _results: [Result<HTTPExchange.Response, HTTPExchange.Failure>] = []
        var results: [Result<HTTPExchange.Response, HTTPExchange.Failure>] { lock.withLock { _results } }
        func record(_ result: Result<HTTPExchange.Response, HTTPExchange.Failure>) {
            lock.withLock { _results.append(result) }
            signal.signal()
        }
    }

    /// Starts an exchange on the loop thread and waits (bounded) for its one outcome; also checks that
    /// no second one follows.
    private func exchange(_ request: HTTPExchange.Request, limits: HTTPExchange.Limits = HTTPExchange.Limits(timeoutSeconds: 10),
                          file: StaticString = #filePath, line: UInt = #line) -> Result<HTTPExchange.Response, HTTPExchange.Failure>? {
        let outcome = Outcome()
        let loop = loopThread.loop
        let exchange = loopThread.sync { HTTPExchange(loop: loop, request: request, limits: limits) { outcome.record($0) } }
        XCTAssertTrue(waitUntil(outcome.signal, timeout: 20) { !outcome.results.isEmpty }, "no outcome", file: file, line: line)
        // A loop turn later: anything else the exchange would report has been reported.
        loopThread.sync { withExtendedLifetime(exchange) {} }
        XCTAssertLessThanOrEqual(outcome.results.count, 1, "more than one outcome: \(outcome.results)", file: file, line: line)
        return outcome.results.first
    }

    private func failure(_ result: Result<HTTPExchange.Response, HTTPExchange.Failure>?) -> HTTPExchange.Failure? {
        guard case .failure(let failure)? = result else { return nil }
        return failure
    }

    private func request(port: UInt16, method: String = "GET", target: String, body: [UInt8] = [],
                         host: String = "127.0.0.1", tls: TransportTLSClientContext? = nil) -> HTTPExchange.Request {
        HTTPExchange.Request(host: host, port: port, tls: tls, method: method, target: target,
                             fields: [("Host", "\(host):\(port)"), ("Accept", "text/plain")], body: body)
    }

    func testPostGetsTheWholeResponse() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let result = exchange(request(port: server.port, method: "POST", target: "/echo?x=1", body: Array("grant_type=x".utf8)))
        guard case .success(let response)? = result else { return XCTFail("\(String(describing: result))") }
        XCTAssertEqual(response.status, 200)
        XCTAssertEqual(response.field("content-type"), "text/plain")
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "POST /echo?x=1\ngrant_type=x")
    }

    func testChunkedResponseUpToTheLimitArrives() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let result = exchange(request(port: server.port, target: "/stream?200000"), limits: HTTPExchange.Limits(timeoutSeconds: 10, maxBodyBytes: 200_000))
        guard case .success(let response)? = result else { return XCTFail("\(String(describing: result))") }
        XCTAssertTrue(response.body == expectedPattern(200_000))
    }

    /// Over the limit fails, whether the length is announced (refused before the body is read) or only
    /// found out while reading a chunked body.
    func testBodyOverTheLimitFails() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let limits = HTTPExchange.Limits(timeoutSeconds: 10, maxBodyBytes: 100_000)
        for target in ["/known?100001", "/stream?300000"] {
            let failure = failure(exchange(request(port: server.port, target: target), limits: limits))
            XCTAssertEqual(failure, .responseTooLarge(limit: 100_000), target)
            XCTAssertEqual(failure?.description, "response too large (over 100000 bytes)")
            XCTAssertEqual(failure?.requestMayHaveReachedPeer, true)
        }
    }

    func testSilentServerTimesOutAfterTheRequestLeft() throws {
        let upstream = CannedUpstream(answer: "")
        defer { upstream.stop() }
        let started = Date()
        let failure = failure(exchange(request(port: upstream.port, target: "/slow"), limits: HTTPExchange.Limits(timeoutSeconds: 0.3)))
        XCTAssertEqual(failure, .timedOut(responseStarted: false))
        XCTAssertEqual(failure?.description, "timed out")
        XCTAssertEqual(failure?.requestMayHaveReachedPeer, true, "the request was sent: its outcome is unknown")
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.25)
    }

    /// The deadline covers the whole exchange, not each read: a server that trickles is cut off.
    func testTheDeadlineCoversTheWholeResponse() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        defer { upstream.stop() }
        let failure = failure(exchange(request(port: upstream.port, target: "/"), limits: HTTPExchange.Limits(timeoutSeconds: 0.3)))
        XCTAssertEqual(failure, .timedOut(responseStarted: true))
    }

    func testUnresolvableNameFailsBeforeAnythingIsSent() throws {
        let failure = failure(exchange(request(port: 80, target: "/", host: "nonexistent.invalid")))
        guard case .nameNotResolved(let detail)? = failure else { return XCTFail("\(String(describing: failure))") }
        XCTAssertTrue(detail.hasPrefix("cannot resolve nonexistent.invalid: "), detail)
        XCTAssertTrue(failure?.description.hasPrefix("could not connect: cannot resolve nonexistent.invalid") ?? false)
        XCTAssertEqual(failure?.requestMayHaveReachedPeer, false)
    }

    func testRefusedConnectFailsBeforeAnythingIsSent() throws {
        let probe = CannedUpstream(answer: "")
        let port = probe.port
        probe.stop()
        let failure = failure(exchange(request(port: port, target: "/")))
        XCTAssertEqual(failure, .connectFailed("connect 127.0.0.1:\(port): Connection refused"))
        XCTAssertEqual(failure?.description, "could not connect: connect 127.0.0.1:\(port): Connection refused")
        XCTAssertEqual(failure?.requestMayHaveReachedPeer, false)
    }

    /// The server says 10 bytes, sends 3 and closes.
    func testConnectionClosedMidResponse() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let failure = failure(exchange(request(port: server.port, target: "/short")))
        XCTAssertEqual(failure, .connectionLost(responseStarted: true, cause: nil))
        XCTAssertEqual(failure?.description, "connection lost mid-response")
    }

    func testMalformedResponseIsNamed() throws {
        let upstream = CannedUpstream(answer: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")
        defer { upstream.stop() }
        let failure = failure(exchange(request(port: upstream.port, target: "/")))
        guard case .malformedResponse? = failure else { return XCTFail("\(String(describing: failure))") }
        XCTAssertTrue(failure?.description.hasPrefix("invalid HTTP response: ") ?? false)
    }

    /// Over TLS: verified against the test CA; a certificate for another name fails the handshake with
    /// the verification's reason, before any byte of the request left.
    func testTLSVerificationSuccessAndFailure() throws {
        let pki = try TestPKI.shared()
        let good = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { good.stop() }
        let tls = try TransportTLSClientContext(caFile: pki.caFile.path)
        let result = exchange(request(port: good.port, method: "POST", target: "/token", body: Array("abc".utf8), host: "localhost", tls: tls))
        guard case .success(let response)? = result else { return XCTFail("\(String(describing: result)) \(good.stderrText)") }
        XCTAssertEqual(response.field("X-SNI"), "localhost")
        XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "3 294")

        let wrong = try TLSTestServer(role: .upstream, identity: pki.wrongHost)
        defer { wrong.stop() }
        let failure = failure(exchange(request(port: wrong.port, target: "/", host: "localhost", tls: tls)))
        XCTAssertEqual(failure, .tlsHandshakeFailed(reason: "certificate verification failed: hostname mismatch", certificateRejected: true))
        XCTAssertEqual(failure?.description, "TLS failure: certificate verification failed: hostname mismatch")
        XCTAssertEqual(failure?.requestMayHaveReachedPeer, false)
    }

    /// Mutual TLS refused by the server (TLS 1.2: inside the handshake): the peer's alert is the reason,
    /// and it is not our verification's.
    func testClientCertificateRefusalNamesTheAlert() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server, clientCA: pki.caFile, tls12Only: true)
        defer { upstream.stop() }
        let tls = try TransportTLSClientContext(caFile: pki.caFile.path)
        let failure = failure(exchange(request(port: upstream.port, target: "/", host: "localhost", tls: tls)))
        guard case .tlsHandshakeFailed(let reason, let rejected)? = failure else { return XCTFail("\(String(describing: failure))") }
        XCTAssertTrue(reason.hasPrefix("TLS alert from the peer: "), reason)
        XCTAssertFalse(rejected)
    }

    /// A cancelled exchange reports nothing and closes its connection.
    func testCancelReportsNothing() throws {
        let upstream = CannedUpstream(answer: "")
        defer { upstream.stop() }
        let outcome = Outcome()
        let loop = loopThread.loop
        let exchange = loopThread.sync {
            HTTPExchange(loop: loop, request: self.request(port: upstream.port, target: "/"), limits: HTTPExchange.Limits(timeoutSeconds: 0.2)) {
                outcome.record($0)
            }
        }
        loopThread.sync { exchange.cancel() }
        XCTAssertFalse(waitUntil(outcome.signal, timeout: 0.6) { !outcome.results.isEmpty }, "cancelled, yet reported \(outcome.results)")
    }

    func testPercentEncodingLeavesOnlyUnreservedCharacters() {
        XCTAssertEqual(PercentEncoding.encode("a b&c=d/é~._-"), "a%20b%26c%3Dd%2F%C3%A9~._-")
        XCTAssertEqual(PercentEncoding.encode("a b", spaceAsPlus: true), "a+b")
        XCTAssertEqual(PercentEncoding.encode("nul\u{0}after"), "nul%00after")
        XCTAssertEqual(PercentEncoding.encode(""), "")
    }
}
