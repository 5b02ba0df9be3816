import Foundation
import HTTPTransport
import HTTPWire
import XCTest

/// Host names are resolved on the loop's resolver (evdns), never by a blocking call on the loop thread.
final class NameResolutionTests: LoopThreadTestCase {
    /// "localhost" comes from the hosts file; the connection reports the address it connected to.
    func testLocalhostResolvesAndCarriesRequests() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "localhost", port: server.port, connectTimeout: 5)
            connection?.handler = recorder
            connection?.startRequest(method: "GET", target: Array("/echo?named".utf8), fields: [("Host", "localhost")], body: .none)
            connection?.finishRequest()
            return connection
        }
        XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 || recorder.count("ended") == 1 }, "\(recorder.events)")
        XCTAssertEqual(String(decoding: recorder.body, as: UTF8.self), "GET /echo?named\n")
        XCTAssertEqual(loopThread.sync { connection?.remote?.description }, "127.0.0.1:\(server.port)")
        loopThread.sync { connection?.close() }
    }

    /// A name that does not resolve is a connect failure naming the host, before any response, so the
    /// caller can answer 502.
    func testUnresolvableNameIsAConnectFailure() throws {
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let connection: HTTPClientConnection? = loopThread.sync {
            let connection = try? HTTPClientConnection(loop: loop, host: "nonexistent.invalid", port: 80, connectTimeout: 3)
            connection?.handler = recorder
            connection?.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", "x")], body: .none)
            connection?.finishRequest()
            return connection
        }
        defer { withExtendedLifetime(connection) {} }
        XCTAssertNotNil(connection)
        XCTAssertTrue(waitUntil(recorder.signal, timeout: 10) { recorder.count("ended") == 1 }, "\(recorder.events)")
        let last = recorder.events.last ?? ""
        XCTAssertTrue(last.hasPrefix("ended connectFailed(\"cannot resolve nonexistent.invalid: "), last)
        XCTAssertTrue(last.hasSuffix("started=false"), last)
        XCTAssertEqual(recorder.count("head"), 0)
    }

    /// A connection closed (and released) while its name resolves reports its local close once; the
    /// cancelled lookup's late callback reaches nothing, and the loop goes on serving.
    func testClosingWhileResolvingCancelsTheLookup() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let recorder = RecordingClient()
        let loop = loopThread.loop
        let gone: Bool = loopThread.sync {
            weak var weakConnection: HTTPClientConnection?
            do {
                let connection = try? HTTPClientConnection(loop: loop, host: "nonexistent.invalid", port: 80)
                connection?.handler = recorder
                connection?.startRequest(method: "GET", target: Array("/".utf8), fields: [("Host", "x")], body: .none)
                weakConnection = connection
                connection?.close()
            }
            return weakConnection == nil
        }
        XCTAssertTrue(gone, "the connection is freed while its lookup is still outstanding")
        XCTAssertEqual(recorder.events, ["ended closedLocally started=false"])
        // The loop keeps working (the cancellation is delivered from it) and nothing else is reported.
        let (second, connection) = (RecordingClient(), loopThread.sync { try? HTTPClientConnection(loop: loop, host: "localhost", port: server.port) })
        loopThread.sync {
            connection?.handler = second
            connection?.startRequest(method: "GET", target: Array("/echo?after".utf8), fields: [("Host", "x")], body: .none)
            connection?.finishRequest()
        }
        XCTAssertTrue(waitUntil(second.signal) { second.count("end") == 1 }, "\(second.events)")
        XCTAssertEqual(recorder.events, ["ended closedLocally started=false"])
        loopThread.sync { connection?.close() }
    }

    func testMalformedHostIsRefusedAtOnce() {
        let loop = loopThread.loop
        let message: String = loopThread.sync {
            do {
                _ = try HTTPClientConnection(loop: loop, host: "bad host/x", port: 80)
                return "connected"
            } catch {
                return "\(error)"
            }
        }
        XCTAssertEqual(message, "bad host/x: not a host name or IP address")
    }

    /// The pool resolves for a new connection and reuses it as with literals.
    func testPoolWithAHostName() throws {
        let server = try TransportTestServer()
        defer { server.stop() }
        let loop = loopThread.loop
        let pool = loopThread.sync { UpstreamPool(loop: loop, host: "localhost", port: server.port) }
        var used: [ObjectIdentifier] = []
        for index in 1...2 {
            let recorder = RecordingClient()
            let held = ResultBox<HTTPClientConnection>()
            loopThread.sync {
                _ = pool.acquire { result in
                    guard case .success(let connection) = result else { return XCTFail("\(result)") }
                    held.value = connection   // the caller owns a connection until it releases it
                    connection.handler = recorder
                    connection.startRequest(method: "GET", target: Array("/echo?\(index)".utf8), fields: [("Host", "x")], body: .none)
                    connection.finishRequest()
                }
            }
            XCTAssertTrue(waitUntil(recorder.signal) { recorder.count("end") == 1 }, "\(recorder.events)")
            XCTAssertEqual(String(decoding: recorder.body, as: UTF8.self), "GET /echo?\(index)\n")
            loopThread.sync {
                if let connection = held.value {
                    used.append(ObjectIdentifier(connection))
                    pool.release(connection)
                }
                held.value = nil
            }
        }
        XCTAssertEqual(used.count, 2)
        XCTAssertEqual(Set(used).count, 1, "the second request reuses the first connection")
        loopThread.sync { pool.closeIdle() }
    }
}
