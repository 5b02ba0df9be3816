import Foundation
import XCTest

/// Request smuggling and open-proxy probes: each ambiguous request must be answered 400 (or the
/// connection closed) and must never reach the upstream in any form.
final class RequestHygieneTests: RelayTestCase {
    private struct Probe {
        let name: String
        let bytes: String
    }

    private func probes(port: Int) -> [Probe] {
        let host = "Host: 127.0.0.1:\(port)\r\n"
        return [
            Probe(name: "duplicate Content-Length", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc"),
            Probe(name: "conflicting Content-Length", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde"),
            Probe(name: "Content-Length list", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: 3, 3\r\n\r\nabc"),
            Probe(name: "Content-Length +3", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: +3\r\n\r\nabc"),
            Probe(name: "Content-Length -1", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: -1\r\n\r\n"),
            Probe(name: "Content-Length hex", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: 0x3\r\n\r\nabc"),
            Probe(name: "empty Content-Length", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: \r\n\r\n"),
            Probe(name: "CL with TE", bytes: "POST /x HTTP/1.1\r\n\(host)Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            Probe(name: "TE gzip, chunked", bytes: "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            Probe(name: "TE chunked, gzip", bytes: "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            Probe(name: "TE twice", bytes: "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            Probe(name: "TE identity", bytes: "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc"),
            Probe(name: "TE xchunked", bytes: "POST /x HTTP/1.1\r\n\(host)Transfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
            Probe(name: "empty header name", bytes: "GET /x HTTP/1.1\r\n\(host): value\r\n\r\n"),
            Probe(name: "space in header name", bytes: "GET /x HTTP/1.1\r\n\(host)Bad Name: value\r\n\r\n"),
            Probe(name: "space before colon", bytes: "GET /x HTTP/1.1\r\n\(host)Content-Length : 0\r\n\r\n"),
            Probe(name: "control character in value", bytes: "GET /x HTTP/1.1\r\n\(host)X-A: a\u{01}b\r\n\r\n"),
            Probe(name: "DEL in value", bytes: "GET /x HTTP/1.1\r\n\(host)X-A: a\u{7F}b\r\n\r\n"),
            Probe(name: "bare CR in value", bytes: "GET /x HTTP/1.1\r\n\(host)X-A: a\rb\r\n\r\n"),
            Probe(name: "HTTP/1.1 without Host", bytes: "GET /x HTTP/1.1\r\n\r\n"),
            Probe(name: "two Host headers", bytes: "GET /x HTTP/1.1\r\n\(host)Host: evil.example\r\n\r\n"),
            Probe(name: "absolute-form, foreign host", bytes: "GET http://evil.example/steal HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
            Probe(name: "absolute-form, foreign port", bytes: "GET http://127.0.0.1:1/steal HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "absolute-form, https to the proxy", bytes: "GET https://127.0.0.1:\(port)/x HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "absolute-form with userinfo", bytes: "GET http://user@127.0.0.1:\(port)/x HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "asterisk-form", bytes: "OPTIONS * HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "NUL in value", bytes: "GET /x HTTP/1.1\r\n\(host)X-A: b\u{0}c\r\n\r\n"),
            Probe(name: "bare CR in target", bytes: "GET /a\rAuthorization: Bearer stolen\r HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "TAB in target", bytes: "GET /a\tb HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "control character in target", bytes: "GET /a\u{01}b HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "DEL in target", bytes: "GET /a\u{7F}b HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "dot segments escaping the base path", bytes: "GET /../../etc/passwd HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "dot segment inside the path", bytes: "GET /x/../public/x HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "percent-encoded dot segment", bytes: "GET /%2e%2E/etc HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "TRACE (would echo the token)", bytes: "TRACE /x HTTP/1.1\r\n\(host)\r\n"),
            Probe(name: "CONNECT", bytes: "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n"),
        ]
    }

    func testAmbiguousRequestsAreRefusedAndNeverForwarded() throws {
        let relay = try startRelay()
        var outcomes: [String] = []
        for probe in probes(port: relay.proxyPort) {
            // evhttp never closes after answering a CONNECT (it expects a tunnel to take over); the
            // 405 still ends the exchange, and the connection keeps speaking plain HTTP.
            let isConnect = probe.name == "CONNECT"
            let started = Date()
            let raw = try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(probe.bytes.utf8), timeout: isConnect ? 0.5 : 5)
            if !isConnect {
                XCTAssertLessThan(Date().timeIntervalSince(started), 2, "\(probe.name): the connection must be closed after the refusal")
            }
            let text = String(decoding: raw, as: UTF8.self)
            // 501: a transfer coding the transport engine does not implement (RFC 9112 §6.1), refused all the same.
            let refused = text.isEmpty || text.hasPrefix("HTTP/1.1 400") || text.hasPrefix("HTTP/1.1 405") || text.hasPrefix("HTTP/1.1 501")
            XCTAssertTrue(refused, "\(probe.name): \(text.prefix(200))")
            // Which layer answered (evhttp's HTML 400 or tokenrelay's JSON), for the record.
            outcomes.append("\(probe.name): \(text.isEmpty ? "closed" : text.contains("\"error\"") ? "tokenrelay" : "evhttp")")
        }
        print("hygiene probes:\n  " + outcomes.joined(separator: "\n  "))
        XCTAssertEqual(api.requestCount, 0, "the upstream saw: \(api.requests.map { "\($0.method) \($0.target)" })")
        XCTAssertEqual(api.acceptedConnections, 0, "no upstream connection may be opened for a refused request")
        // The relay is still healthy after the probes.
        XCTAssertEqual(try get(relay).status, 200)
    }

    func testTargetBytesThatAreNotUTF8AreRefusedAndUTF8IsForwardedUnchanged() throws {
        let relay = try startRelay()
        var invalid = Data("GET /caf".utf8)
        invalid.append(0xFF)
        invalid.append(Data(" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8))
        let refused = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: invalid), as: UTF8.self)
        XCTAssertTrue(refused.hasPrefix("HTTP/1.1 400"), String(refused.prefix(200)))
        XCTAssertEqual(api.requestCount, 0)
        let utf8 = "GET /caf\u{E9}?q=%20 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        let accepted = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(utf8.utf8)), as: UTF8.self)
        XCTAssertTrue(accepted.hasPrefix("HTTP/1.1 200"), String(accepted.prefix(200)))
        XCTAssertEqual(api.requests.last?.target, "/caf\u{E9}?q=%20")
    }

    /// evhttp counts header bytes without line endings: many tiny fields pass its limit. The head is
    /// counted whole (request line and line endings included).
    func testHeaderLimitCountsLineEndings() throws {
        let relay = try startRelay(["limits": ["max_header_bytes": 4096]])
        let fields = String(repeating: "X:1\r\n", count: 1000)  // 3000 bytes to evhttp, 5000 on the wire
        let text = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort,
                                                               bytes: Data("GET /many HTTP/1.1\r\nHost: x\r\n\(fields)\r\n".utf8)),
                          as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("HTTP/1.1 431"), String(text.prefix(200)))
        XCTAssertEqual(api.requestCount, 0)
        XCTAssertEqual(try get(relay, "/normal").status, 200)
    }

    /// Bytes that cannot start a request (here a TLS ClientHello sent to the plain port) are answered 400
    /// at once, not after `timeouts.client_header_seconds`, although no line end ever comes.
    func testATLSHandshakeOnThePlainPortIsAnswered400AtOnce() throws {
        let relay = try startRelay(["timeouts": ["client_header_seconds": 30]])
        let clientHello: [UInt8] = [0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03] + Array(repeating: 0x2a, count: 64)
        let started = Date()
        let text = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(clientHello), timeout: 10), as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("HTTP/1.1 400"), String(text.prefix(200)))
        XCTAssertLessThan(Date().timeIntervalSince(started), 5)
        XCTAssertEqual(api.requestCount, 0)
    }

    func testOnlyHTTP10And11AreAnswered() throws {
        let relay = try startRelay()
        let text = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data("GET /v HTTP/1.2\r\nHost: x\r\n\r\n".utf8)),
                          as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("HTTP/1.1 505"), String(text.prefix(200)))
        XCTAssertEqual(api.requestCount, 0)
    }

    func testPassthroughPrefixesMatchWholeSegments() throws {
        let relay = try startRelay(["upstream": ["passthrough_prefixes": ["/public"]]])
        _ = try get(relay, "/public/x")
        XCTAssertNil(api.requests.last?.header("Authorization"), "under the prefix: no token")
        _ = try get(relay, "/public")
        XCTAssertNil(api.requests.last?.header("Authorization"))
        _ = try get(relay, "/publicity")
        XCTAssertNotNil(api.requests.last?.header("Authorization"), "/publicity is not under /public")
    }

    /// Obs-fold and bare-LF line endings are unambiguous once parsed; the upstream gets a clean message.
    func testLenientSyntaxIsForwardedNormalised() throws {
        let relay = try startRelay()
        let host = "Host: 127.0.0.1:\(relay.proxyPort)"
        let folded = "GET /fold HTTP/1.1\r\n\(host)\r\nX-Folded: a\r\n  b\r\nConnection: close\r\n\r\n"
        XCTAssertTrue(String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(folded.utf8)), as: UTF8.self)
            .hasPrefix("HTTP/1.1 200"))
        // RFC 9112 §5.2: each obs-fold becomes one or more spaces (evhttp makes one, the transport engine
        // replaces the CRLF in place).
        let unfolded = api.requests.last?.header("X-Folded") ?? ""
        XCTAssertTrue(unfolded.hasPrefix("a ") && unfolded.hasSuffix(" b") && unfolded.allSatisfy { $0 == "a" || $0 == "b" || $0 == " " }, unfolded)
        let bareLF = "POST /lf HTTP/1.1\n\(host)\nContent-Length: 3\nConnection: close\n\nabc"
        XCTAssertTrue(String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(bareLF.utf8)), as: UTF8.self)
            .hasPrefix("HTTP/1.1 200"))
        XCTAssertEqual(api.requests.last?.path, "/lf")
        XCTAssertEqual(api.requests.last?.bodyText, "abc")
    }

    /// A head whose lines end in bare LF may end with LF CR LF, as evhttp accepts: the body after it is
    /// body (a NUL in it is data, not a NUL in the head).
    func testHeadEndingInLFCRLFLeavesTheBodyAlone() throws {
        let relay = try startRelay()
        var request = Data("POST /echo HTTP/1.1\nHost: x\nContent-Length: 5\nConnection: close\n\r\n".utf8)
        request.append(contentsOf: [0x61, 0x62, 0x00, 0x63, 0x64])
        let text = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: request), as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("HTTP/1.1 200"), String(text.prefix(200)))
        XCTAssertEqual(api.requests.last?.body, Data([0x61, 0x62, 0x00, 0x63, 0x64]))
    }

    func testAbsoluteFormNamingUpstreamOrProxyIsNormalisedToOriginForm() throws {
        let relay = try startRelay()
        for authority in ["127.0.0.1:\(api.port)", "127.0.0.1:\(relay.proxyPort)", "localhost:\(relay.proxyPort)"] {
            let request = "GET http://\(authority)/abs/path?q=1 HTTP/1.1\r\nHost: \(authority)\r\nConnection: close\r\n\r\n"
            let text = String(decoding: try HTTPTestClient.sendRaw(port: relay.proxyPort, bytes: Data(request.utf8)), as: UTF8.self)
            XCTAssertTrue(text.hasPrefix("HTTP/1.1 200"), "\(authority): \(text.prefix(200))")
            XCTAssertEqual(api.requests.last?.target, "/abs/path?q=1")
            XCTAssertEqual(api.requests.last?.header("Host"), "127.0.0.1:\(api.port)")
        }
    }

    func testForwardingHeadersAreAppended() throws {
        let relay = try startRelay()
        _ = try get(relay, "/fwd", headers: [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-Proto", "https"), ("Via", "1.0 edge")])
        let seen = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(seen.headers(named: "X-Forwarded-For"), ["203.0.113.7, 127.0.0.1"])
        XCTAssertEqual(seen.headers(named: "X-Forwarded-Proto"), ["http"])
        XCTAssertEqual(seen.headers(named: "Via"), ["1.0 edge, 1.1 tokenrelay"])
        _ = try get(relay, "/fwd2")
        let plain = try XCTUnwrap(api.requests.last)
        XCTAssertEqual(plain.header("X-Forwarded-For"), "127.0.0.1")
        XCTAssertEqual(plain.header("Via"), "1.1 tokenrelay")
    }

    func testUnderscoreHeadersCanBeDropped() throws {
        let kept = try startRelay()
        _ = try get(kept, "/u", headers: [("X_User", "mallory"), ("X-Other", "a")])
        XCTAssertEqual(api.requests.last?.header("X_User"), "mallory", "kept by default")
        let dropping = try startRelay(["forwarding": ["drop_underscore_headers": true]])
        _ = try get(dropping, "/u", headers: [("X_User", "mallory"), ("X-Other", "a")])
        XCTAssertNil(api.requests.last?.header("X_User"))
        XCTAssertEqual(api.requests.last?.header("X-Other"), "a")
    }

    func testForwardingHeadersCanBeSwitchedOff() throws {
        let relay = try startRelay(["forwarding": ["x_forwarded_for": false, "x_forwarded_proto": false, "via": false]])
        _ = try get(relay, "/fwd", headers: [("Via", "1.0 edge")])
        let seen = try XCTUnwrap(api.requests.last)
        XCTAssertNil(seen.header("X-Forwarded-For"))
        XCTAssertNil(seen.header("X-Forwarded-Proto"))
        XCTAssertEqual(seen.headers(named: "Via"), ["1.0 edge"], "a switched-off header is passed through untouched")
    }
}
