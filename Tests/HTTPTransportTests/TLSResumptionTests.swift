import Foundation
import HTTPTransport
import TLSFixtures
import XCTest

/// TLS session resumption: a context keeps the last session per server name and offers it on the next
/// connection to that name; the upstream (Python's `ssl`) reports whether it resumed (`X-Resumed`).
final class TLSResumptionTests: LoopThreadTestCase {
    /// A request's response fields, failing the test when the connection ended instead.
    private func fields(_ host: String, _ port: UInt16, tls: TransportTLSClientContext, log: TLSTestServer) throws -> [String: String] {
        let (fields, ended) = get(host, port, tls: tls)
        if let ended { throw FixtureError("request to \(host) ended: \(ended); upstream: \(log.stderrText)") }
        return fields
    }

    private func context() throws -> TransportTLSClientContext {
        try TransportTLSClientContext(caFile: TestPKI.shared().caFile.path)
    }

    /// One request on a new connection, which is closed afterwards (so the next request reconnects).
    /// The response's fields; how the connection ended instead, if it did.
    private func get(_ host: String, _ port: UInt16, tls: TransportTLSClientContext) -> (fields: [String: String], ended: ConnectionEnd?) {
        let recorder = FieldRecorder()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: host, port: port, tls: tls, connectTimeout: 10)
            connection?.handler = recorder
            connection?.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", host)], body: .none)
            connection?.finishRequest()
            return connection
        }
        XCTAssertNotNil(connection)
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 20) { recorder.ends == 1 || recorder.ended != nil })
        let outcome = (recorder.fields, recorder.ended)
        loopThread.sync { connection?.close() }
        return outcome
    }

    /// The second connection to the same name resumes the first one's session, under TLS 1.3 (a ticket
    /// that arrives after the handshake) and TLS 1.2 alike; the context counts one full, one resumed.
    func testReconnectToTheSameNameIsResumed() throws {
        for tls12Only in [false, true] {
            let upstream = try TLSTestServer(role: .upstream, identity: TestPKI.shared().server, tls12Only: tls12Only)
            defer { upstream.stop() }
            let tls = try context()
            let first = try fields("localhost", upstream.port, tls: tls, log: upstream)
            XCTAssertEqual(first["x-resumed"], "0", upstream.stderrText)
            let second = try fields("localhost", upstream.port, tls: tls, log: upstream)
            XCTAssertEqual(second["x-resumed"], "1", "TLS 1.2 only: \(tls12Only)")
            XCTAssertNotEqual(first["x-connection"], second["x-connection"])
            XCTAssertTrue(tls.handshakeCounts == (full: 1, resumed: 1), "\(tls.handshakeCounts)")
        }
    }

    /// A session is never offered to another name, even on the same server and context.
    func testAnotherNameMakesAFullHandshake() throws {
        let upstream = try TLSTestServer(role: .upstream, identity: TestPKI.shared().server)
        defer { upstream.stop() }
        let tls = try context()
        _ = try fields("localhost", upstream.port, tls: tls, log: upstream)
        let other = try fields("127.0.0.1", upstream.port, tls: tls, log: upstream)
        XCTAssertEqual(other["x-resumed"], "0")
        XCTAssertTrue(tls.handshakeCounts == (full: 2, resumed: 0), "\(tls.handshakeCounts)")
        let again = try fields("localhost", upstream.port, tls: tls, log: upstream)
        XCTAssertEqual(again["x-resumed"], "1")
    }

    /// A failed handshake forgets the name's session: the next connection to the name is a full handshake.
    func testHandshakeFailureForgetsTheSession() throws {
        let pki = try TestPKI.shared()
        let upstream = try TLSTestServer(role: .upstream, identity: pki.server)
        defer { upstream.stop() }
        let impostor = try TLSTestServer(role: .upstream, identity: pki.wrongHost)
        defer { impostor.stop() }
        let tls = try context()
        _ = try fields("localhost", upstream.port, tls: tls, log: upstream)
        guard case .connectFailed(let reason)? = get("localhost", impostor.port, tls: tls).ended else {
            return XCTFail("the impostor's certificate was accepted")
        }
        XCTAssertTrue(reason.hasSuffix("hostname mismatch"), reason)
        let after = try fields("localhost", upstream.port, tls: tls, log: upstream)
        XCTAssertEqual(after["x-resumed"], "0")
        XCTAssertTrue(tls.handshakeCounts == (full: 2, resumed: 0), "\(tls.handshakeCounts)")
    }

    /// A handshake given up at the connect timeout (a server that stalls, perhaps on the offered session)
    /// forgets the name's session too: the next connection to the name is a full handshake.
    func testHandshakeTimeoutForgetsTheSession() throws {
        let upstream = try TLSTestServer(role: .upstream, identity: TestPKI.shared().server)
        defer { upstream.stop() }
        let silent = CannedUpstream(answer: "")
        defer { silent.stop() }
        let tls = try context()
        _ = try fields("localhost", upstream.port, tls: tls, log: upstream)
        let recorder = FieldRecorder()
        let loop = loopThread.loop
        let stalled: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "localhost", port: silent.port, tls: tls, connectTimeout: 0.3)
            connection?.handler = recorder
            connection?.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", "localhost")], body: .none)
            connection?.finishRequest()
            return connection
        }
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 10) { recorder.ended != nil })
        guard case .connectFailed(let reason)? = recorder.ended else { return XCTFail("\(String(describing: recorder.ended))") }
        XCTAssertTrue(reason.contains("did not finish within"), reason)
        loopThread.sync { stalled?.close() }
        let after = try fields("localhost", upstream.port, tls: tls, log: upstream)
        XCTAssertEqual(after["x-resumed"], "0")
        XCTAssertTrue(tls.handshakeCounts == (full: 2, resumed: 0), "\(tls.handshakeCounts)")
    }
}
