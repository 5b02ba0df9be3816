import CLibevent
import Foundation
import Glibc
import HTTPTransport
import HTTPWire
import TLSFixtures
import XCTest

/// Records one response at a time with its fields (the TLS upstream reports the connection number, the
/// SNI it saw and the client certificate's name in fields).
class FieldRecorder: HTTPClientConnectionHandler, @unchecked Sendable {
    private let lock = NSLock()
    let signal = DispatchSemaphore(value: 0)
    private var _fields: [String: String] = [:]
    private var _body: [UInt8] = []
    private var _ends = 0
    private var _ended: ConnectionEnd?
    var fields: [String: String] { lock.withLock { _fields } }
    var body: [UInt8] { lock.withLock { _body } }
    var ends: Int { lock.withLock { _ends } }
    var ended: ConnectionEnd? { lock.withLock { _ended } }

    /// Runs on the loop thread after the end of a response is counted (set there too).
    var onEnd: (() -> Void)?

    func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {}
    func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        var fields = ["status": String(head.status)]
        head.forEachField { name, value in
            fields[String(decoding: name, as: UTF8.self).lowercased()] = String(decoding: value, as: UTF8.self)
        }
        lock.withLock { _fields = fields }
    }
    func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        lock.withLock { _body.append(contentsOf: bytes) }
    }
    func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        lock.withLock { _ends += 1 }
        onEnd?()
        onEnd = nil
        signal.signal()
    }
    func connectionCanSendMore(_ connection: HTTPClientConnection) {}
    func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        lock.withLock { _ended = ended }
        signal.signal()
    }
}

/// Pauses the connection after each body piece and resumes it from a timer on the next loop turn.
final class PausingRecorder: FieldRecorder, @unchecked Sendable {
    var resumer: TransportTimer?
    private(set) var pauses = 0

    override func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        super.connection(connection, receivedBody: bytes)
        pauses += 1
        connection.pauseReading()
        resumer?.schedule(after: 0)
    }
}

func tlsPattern(_ count: Int) -> [UInt8] { (0..<count).map { UInt8($0 % 251) } }

final class UpstreamTLSTests: LoopThreadTestCase {
    private func context(caFile: String? = nil, client: TestPKI.Identity? = nil, verify: Bool = true,
                         serverName: String? = nil) throws -> TransportTLSClientContext {
        try TransportTLSClientContext(caFile: caFile ?? TestPKI.shared().caFile.path, clientCertificateFile: client?.cert.path,
                                      clientKeyFile: client?.key.path, verifyPeer: verify, serverName: serverName)
    }

    /// Opens a connection, sends one request and waits for its end or the connection's; returns the
    /// connection (the caller owns it) and the recorder.
    @discardableResult
    private func request(_ host: String, _ port: UInt16, tls: TransportTLSClientContext, method: String = "GET", target: String = "/",
                         body: [UInt8] = [], connectTimeout: Double? = 10) -> (HTTPClientConnection?, FieldRecorder) {
        let recorder = FieldRecorder()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: host, port: port, tls: tls, connectTimeout: connectTimeout)
            connection?.handler = recorder
            connection?.startRequest(method: method, target: Array(target.utf8), fields: [("Host", host)],
                                     body: body.isEmpty ? .none : .known(body.count))
            if !body.isEmpty { connection?.sendBody(body) }
            connection?.finishRequest()
            return connection
        }
        XCTAssertNotNil(connection)
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 20) { recorder.ends == 1 || recorder.ended != nil })
        return (connection, recorder)
    }

    private func connectFailure(_ recorder: FieldRecorder) -> String {
        guard case .connectFailed(let text)? = recorder.ended else { return "not a connect failure: \(String(describing: recorder.ended))" }
        return text
    }

    /// The pool keeps TLS connections alive: three requests in turn use one connection (one handshake),
    /// the certificate is verified for "localhost" (resolved, not a literal), and SNI carries the name.
    func testPooledKeepAliveOverVerifiedTLS() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        var settings = UpstreamPool.Settings(maxConnections: 2)
        settings.tls = try context()
        settings.connectTimeout = 10
        let loop = loopThread.loop
        let pool = loopThread.sync { UpstreamPool(loop: loop, host: "localhost", port: upstream.port, settings: settings) }
        var seen: [String] = []
        for index in 1...3 {
            let recorder = FieldRecorder()
            loopThread.sync {
                _ = pool.acquire { result in
                    guard case .success(let connection) = result else { return XCTFail("acquire \(index): \(result)") }
                    connection.handler = recorder
                    connection.startRequest(method: "GET", target: Array("/r\(index)".utf8), fields: [("Host", "localhost")], body: .none)
                    connection.finishRequest()
                    recorder.onEnd = { pool.release(connection) }
                }
            }
            XCTAssertTrue(waitUntil(recorder.signal, timeout: 20) { recorder.ends == 1 || recorder.ended != nil }, "request \(index)")
            XCTAssertNil(recorder.ended, upstream.stderrText)
            XCTAssertEqual(recorder.fields["status"], "200")
            XCTAssertEqual(recorder.fields["x-sni"], "localhost")
            seen.append(recorder.fields["x-connection"] ?? "?")
        }
        XCTAssertEqual(Set(seen).count, 1, "one TLS connection for all three requests: \(seen)")
        XCTAssertEqual(loopThread.sync { pool.openCount }, 1)
        loopThread.sync { pool.closeIdle() }
    }

    /// Several TLS records per read, a read buffer filled before OpenSSL is empty, writes that the socket
    /// takes only in part: a 3 MB response and a 2 MB upload arrive whole.
    func testLargeBodiesBothWaysOverTLS() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        let tls = try context()
        let (download, downloaded) = request("127.0.0.1", upstream.port, tls: tls, target: "/big?3000000")
        XCTAssertNil(downloaded.ended)
        XCTAssertEqual(downloaded.body.count, 3_000_000)
        XCTAssertTrue(downloaded.body == tlsPattern(3_000_000))
        XCTAssertTrue(loopThread.sync { download?.isReusable ?? false })
        let upload = (0..<2_000_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let checksum = upload.reduce(UInt64(0)) { ($0 + UInt64($1)) % (1 << 32) }
        let (uploader, uploaded) = request("127.0.0.1", upstream.port, tls: tls, method: "POST", target: "/upload", body: upload)
        XCTAssertNil(uploaded.ended)
        XCTAssertEqual(String(decoding: uploaded.body, as: UTF8.self), "2000000 \(checksum)")
        loopThread.sync {
            download?.close()
            uploader?.close()
        }
    }

    /// An error another OpenSSL call left in the loop thread's queue must not be taken for this
    /// connection's: reads and writes start with an empty queue (they clear it only when it is not).
    func testStaleErrorInTheQueueDoesNotFailReadsOrWrites() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        let tls = try context()
        let (first, answered) = request("127.0.0.1", upstream.port, tls: tls, target: "/big?1000")
        XCTAssertNil(answered.ended)
        let recorder = FieldRecorder()
        loopThread.sync {
            // ERR_LIB_SSL (20), any reason: a leftover of some other call on this thread.
            withVaList([]) { arguments in
                ERR_new()
                ERR_vset_error(20, 65, nil, arguments)
            }
            XCTAssertNotEqual(ERR_peek_error(), 0)
            first?.handler = recorder
            first?.startRequest(method: "GET", target: Array("/big?70000".utf8), fields: [("Host", "127.0.0.1")], body: .none)
            first?.finishRequest()
        }
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 20) { recorder.ends == 1 || recorder.ended != nil })
        XCTAssertNil(recorder.ended)
        XCTAssertTrue(recorder.body == tlsPattern(70000))
        loopThread.sync {
            XCTAssertEqual(ERR_peek_error(), 0, "the stale error was cleared before the read")
            first?.close()
        }
    }

    /// A receiver that pauses after every piece and resumes on the next loop turn: OpenSSL may hold
    /// decrypted bytes then that the socket will never announce, and the transfer must not stall on them.
    func testPausingAndResumingMidRecordDoesNotStall() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        let tls = try context()
        let recorder = PausingRecorder()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "localhost", port: upstream.port,
                                                  limits: HTTPWireLimits(maxHeadBytes: 1000), inputCapacity: 1000, tls: tls)
            recorder.resumer = TransportTimer(loop: loop) { [weak connection] in connection?.resumeReading() }
            connection?.handler = recorder
            connection?.startRequest(method: "GET", target: Array("/big?1000000".utf8), fields: [("Host", "localhost")], body: .none)
            connection?.finishRequest()
            return connection
        }
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 15) { recorder.ends == 1 || recorder.ended != nil })
        XCTAssertNil(recorder.ended)
        XCTAssertGreaterThan(recorder.pauses, 900)
        XCTAssertTrue(recorder.body == tlsPattern(1_000_000))
        loopThread.sync {
            recorder.resumer = nil
            connection?.close()
        }
    }

    func testUnknownCAFailsTheHandshakeNamingTheCause() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        // The system store does not know the test CA.
        let tls = try TransportTLSClientContext()
        let (connection, recorder) = request("localhost", upstream.port, tls: tls)
        defer { withExtendedLifetime(connection) {} }
        XCTAssertEqual(connectFailure(recorder),
                       "TLS handshake with 127.0.0.1:\(upstream.port) failed: certificate verification failed: unable to get local issuer certificate")
    }

    func testWrongHostFailsTheHandshakeNamingTheCause() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.wrongHost)
        defer { upstream.stop() }
        let (connection, recorder) = request("localhost", upstream.port, tls: try context())
        defer { withExtendedLifetime(connection) {} }
        XCTAssertEqual(connectFailure(recorder),
                       "TLS handshake with 127.0.0.1:\(upstream.port) failed: certificate verification failed: hostname mismatch")
    }

    /// `serverName` replaces the host for SNI and verification (an upstream reached by address).
    func testServerNameOverridesTheVerifiedNameAndSNI() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.wrongHost)
        defer { upstream.stop() }
        let (connection, recorder) = request("127.0.0.1", upstream.port, tls: try context(serverName: "wrong.example.com"))
        XCTAssertNil(recorder.ended)
        XCTAssertEqual(recorder.fields["x-sni"], "wrong.example.com")
        loopThread.sync { connection?.close() }
    }

    func testSkippingVerificationAcceptsAnyCertificate() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.wrongHost)
        defer { upstream.stop() }
        let (connection, recorder) = request("localhost", upstream.port, tls: try TransportTLSClientContext(verifyPeer: false))
        XCTAssertNil(recorder.ended)
        XCTAssertEqual(recorder.fields["status"], "200")
        loopThread.sync { connection?.close() }
    }

    /// Mutual TLS: with the client certificate the upstream sees its name; without it the upstream's
    /// alert is the cause named.
    func testClientCertificate() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server, clientCA: pki.caFile, tls12Only: true)
        defer { upstream.stop() }
        let (connection, recorder) = request("localhost", upstream.port, tls: try context(client: pki.client))
        XCTAssertNil(recorder.ended, upstream.stderrText)
        XCTAssertEqual(recorder.fields["x-client-cn"], TestPKI.clientCommonName)
        loopThread.sync { connection?.close() }

        let (refused, refusal) = request("localhost", upstream.port, tls: try context())
        defer { withExtendedLifetime(refused) {} }
        XCTAssertTrue(connectFailure(refusal).hasPrefix("TLS handshake with 127.0.0.1:\(upstream.port) failed: TLS alert from the peer: "),
                      connectFailure(refusal))
    }

    /// A peer that accepts TCP and never answers the ClientHello is given up on at the connect timeout.
    func testHandshakeIsBoundedByTheConnectTimeout() throws {
        let silent = CannedUpstream(answer: "")
        defer { silent.stop() }
        let started = Date()
        let (connection, recorder) = request("127.0.0.1", silent.port, tls: try context(), connectTimeout: 0.3)
        defer { withExtendedLifetime(connection) {} }
        XCTAssertEqual(connectFailure(recorder), "TLS handshake with 127.0.0.1:\(silent.port) did not finish within 0.3 s")
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 0.25)
    }

    func testContextErrorsNameTheFileAndTheCause() throws {
        let pki = try TestPKI.shared()
        func failure(_ make: () throws -> TransportTLSClientContext) -> String {
            do {
                _ = try make()
                return "built"
            } catch {
                return "\(error)"
            }
        }
        XCTAssertEqual(failure { try TransportTLSClientContext(caFile: "/nonexistent/ca.pem") },
                       "cannot read CA file /nonexistent/ca.pem: No such file or directory")
        XCTAssertTrue(failure { try TransportTLSClientContext(caFile: pki.server.key.path) }.hasPrefix("cannot load CA file \(pki.server.key.path): "))
        XCTAssertEqual(failure { try TransportTLSClientContext(clientCertificateFile: pki.client.cert.path) }, "a client certificate needs its key")
        let mismatch = failure { try TransportTLSClientContext(clientCertificateFile: pki.client.cert.path, clientKeyFile: pki.server.key.path) }
        XCTAssertEqual(mismatch, "cannot load client key \(pki.server.key.path): key values mismatch")
    }
}
