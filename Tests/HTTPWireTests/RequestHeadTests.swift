import HTTPWire
import XCTest

final class RequestHeadTests: XCTestCase {

    func testParsesARequestHeadInPlace() throws {
        let parsed = try XCTUnwrap(parseRequest("GET /a/b?c=d HTTP/1.1\r\nHost: example.test\r\nX-Empty:\r\nAccept:  */* \r\n\r\nBODY"))
        XCTAssertEqual(parsed.head.method, .get)
        XCTAssertEqual(parsed.target, "/a/b?c=d")
        XCTAssertEqual(parsed.head.targetForm, .origin)
        XCTAssertEqual(parsed.head.semantics.version, .http11)
        XCTAssertEqual(parsed.head.fields.count, 3)
        XCTAssertEqual(parsed.values("accept"), ["*/*"], "surrounding whitespace is not part of the value")
        XCTAssertEqual(parsed.values("x-empty"), [""])
        XCTAssertEqual(parsed.head.hostField, 0)
        XCTAssertEqual(parsed.head.headLength, parsed.bytes.count - 4, "the body starts right after the empty line")
        XCTAssertEqual(parsed.head.semantics.framing, BodyFraming.none)
        XCTAssertTrue(parsed.head.semantics.keepAlive)
    }

    /// An unfinished head whose first line cannot start a request is known to be refused before its end.
    func testAnUnfinishedHeadThatCannotBeHTTPIsToldAtOnce() {
        func cannot(_ bytes: [UInt8]) -> Bool { bytes.withUnsafeBytes { HeadParser.requestCannotBeHTTP($0) } }
        XCTAssertTrue(cannot([0x16, 0x03, 0x01, 0x02, 0x00]), "a TLS ClientHello")
        XCTAssertTrue(cannot(Array("GE\u{0}T".utf8)))
        XCTAssertTrue(cannot(Array(" GET /".utf8)), "no method before the space")
        XCTAssertTrue(cannot(Array("\r\nGET\r".utf8)), "the line ends before the method's space")
        XCTAssertTrue(cannot(Array("G(T /".utf8)), "a separator is not a token byte")
        XCTAssertFalse(cannot([]))
        XCTAssertFalse(cannot(Array("GE".utf8)), "still a method in progress")
        XCTAssertFalse(cannot(Array("\r\n\r\nPROPFIND /x".utf8)), "empty lines first, any token method")
        XCTAssertFalse(cannot(Array("GET /\u{1}".utf8)), "only the method is judged early; the rest when the head is whole")
    }

    func testIncompleteHeadAsksForMoreAtEveryPrefix() throws {
        let text = Array("POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n".utf8)
        var parser = HeadParser()
        var head = RequestHead()
        // The same parser sees the head grow one byte at a time, as from a slow client.
        for end in 1...text.count {
            var prefix = Array(text[0..<end])
            let done = try prefix.withUnsafeMutableBytes { try parser.parseRequest($0, into: &head) }
            XCTAssertEqual(done, end == text.count, "prefix of \(end) bytes")
        }
        XCTAssertEqual(head.semantics.framing, .length(3))
        XCTAssertEqual(head.method, .post)
    }

    func testKnownAndOtherMethods() throws {
        let cases: [(String, HTTPMethod)] = [("GET", .get), ("HEAD", .head), ("POST", .post), ("PUT", .put), ("DELETE", .delete),
                                             ("OPTIONS", .options), ("TRACE", .trace), ("PATCH", .patch), ("PROPFIND", .other), ("get", .other)]
        for (token, method) in cases {
            let parsed = try XCTUnwrap(parseRequest("\(token) /x HTTP/1.1\r\nHost: h\r\n\r\n"))
            XCTAssertEqual(parsed.head.method, method, token)
            XCTAssertEqual(parsed.method, token)
        }
        XCTAssertEqual(requestError("G(T /x HTTP/1.1\r\nHost: h\r\n\r\n"), .invalidMethod)
        XCTAssertEqual(requestError(" GET /x HTTP/1.1\r\nHost: h\r\n\r\n"), .invalidMethod)
    }

    func testTargetForms() throws {
        XCTAssertEqual(try parseRequest("GET http://h/x HTTP/1.1\r\nHost: h\r\n\r\n")?.head.targetForm, .absolute)
        XCTAssertEqual(try parseRequest("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n")?.head.targetForm, .asterisk)
        XCTAssertEqual(try parseRequest("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n")?.head.targetForm, .authority)
        XCTAssertEqual(try parseRequest("GET svn+ssh://h/x HTTP/1.1\r\nHost: h\r\n\r\n")?.head.targetForm, .absolute)
        // Each form only with its method, and nothing that is none of them ("h:443" is a URI with scheme "h",
        // which the proxy refuses as a foreign absolute-form target).
        for (method, target) in [("GET", "*"), ("PUT", "+big"), ("GET", "x"), ("GET", "1http://h/"), ("CONNECT", "/x"), ("CONNECT", "*")] {
            XCTAssertEqual(requestError("\(method) \(target) HTTP/1.1\r\nHost: h\r\n\r\n"), .invalidTarget, "\(method) \(target)")
        }
    }

    /// Issue 14 item 9: bare CR, TAB, SP, C0 controls and DEL in the target are refused; other bytes
    /// (0xFF included) are kept unchanged.
    func testRequestTargetControlsAreRefused() throws {
        for bad in ["/a\rAuthorization: Bearer stolen\r", "/a\tb", "/a b", "/a\u{0}b", "/a\u{1}b", "/a\u{1F}b", "/a\u{7F}b", "/a\u{0B}"] {
            let error = requestError("GET \(bad) HTTP/1.1\r\nHost: h\r\n\r\n")
            XCTAssertTrue(error == .invalidTarget || error == .invalidVersion, "\(bad.debugDescription): \(String(describing: error))")
            XCTAssertEqual(error?.requestStatus, 400)
        }
        var bytes = Array("GET /caf".utf8) + [0xFF, 0xC3, 0xA9] + Array(" HTTP/1.1\r\nHost: h\r\n\r\n".utf8)
        let parsed = try XCTUnwrap(parseRequest(bytes))
        XCTAssertEqual(Array(parsed.bytes[parsed.head.target]), Array("/caf".utf8) + [0xFF, 0xC3, 0xA9])
        bytes = Array("GET  /x HTTP/1.1\r\nHost: h\r\n\r\n".utf8)
        XCTAssertThrowsError(try parseRequest(bytes), "two spaces after the method")
        XCTAssertEqual(requestError("GET /x\r\nHost: h\r\n\r\n"), .invalidVersion, "HTTP/0.9 style request line")
    }

    /// Issue 14 item 10: NUL and other controls in a value are refused, never truncated or stripped.
    func testControlsInFieldValuesAreRefused() {
        for value in ["b\u{0}c", "a\u{1}b", "a\u{7F}b", "a\rb", "a\u{1B}b"] {
            XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\r\nX-A: \(value)\r\n\r\n"), .invalidFieldValue, value.debugDescription)
        }
        XCTAssertNil(requestError("GET /x HTTP/1.1\r\nHost: h\r\nX-A: tab\there, caf\u{E9}\r\n\r\n"), "HTAB and obs-text are allowed")
    }

    /// Issue 14 item 15: HTTP/1.0 and 1.1 only.
    func testOnlyHTTP10And11() throws {
        XCTAssertEqual(try parseRequest("GET /x HTTP/1.0\r\n\r\n")?.head.semantics.version, .http10)
        for version in ["HTTP/1.2", "HTTP/2.0", "HTTP/0.9", "HTTP/9.9"] {
            let error = requestError("GET /x \(version)\r\nHost: h\r\n\r\n")
            XCTAssertEqual(error, .unsupportedVersion, version)
            XCTAssertEqual(error?.requestStatus, 505)
        }
        for version in ["HTTP/1.", "http/1.1", "HTTP/1.1.1", "HTTP/11", "HTTP/a.b"] {
            XCTAssertEqual(requestError("GET /x \(version)\r\nHost: h\r\n\r\n"), .invalidVersion, version)
        }
        XCTAssertEqual(requestError("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), .unsupportedVersion)
    }

    /// Issue 14 item 15: the head limit counts every byte including line endings, so 20,000 "X:1" fields
    /// (100 KB on the wire, 60 KB without line endings) exceed 64 KiB.
    func testHeadLimitCountsLineEndings() throws {
        var text = "GET /x HTTP/1.1\r\nHost: h\r\n"
        for _ in 0..<20_000 { text += "X:1\r\n" }
        text += "\r\n"
        XCTAssertEqual(requestError(text, limits: HTTPWireLimits(maxFields: 100_000)), .headTooLarge)
        XCTAssertEqual(HTTPWireError.headTooLarge.requestStatus, 431)

        let exact = "GET /x HTTP/1.1\r\nHost: h\r\n\r\n"
        XCTAssertNotNil(try parseRequest(exact, limits: HTTPWireLimits(maxHeadBytes: exact.utf8.count)))
        XCTAssertEqual(requestError(exact, limits: HTTPWireLimits(maxHeadBytes: exact.utf8.count - 1)), .headTooLarge)
        // An unfinished head is refused as soon as it reaches the limit, without waiting for its end.
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nX: " + String(repeating: "a", count: 100), limits: HTTPWireLimits(maxHeadBytes: 64)), .headTooLarge)
    }

    func testFieldCountLimit() {
        var text = "GET /x HTTP/1.1\r\nHost: h\r\n"
        for i in 0..<10 { text += "X-\(i): 1\r\n" }
        XCTAssertEqual(requestError(text + "\r\n", limits: HTTPWireLimits(maxFields: 10)), .tooManyFields)
        XCTAssertNil(requestError(text + "\r\n", limits: HTTPWireLimits(maxFields: 11)))
    }

    /// Issue 14 item 15: names with "_" are marked so that a proxy can drop them (nginx drops by default).
    func testUnderscoreInFieldNamesIsMarked() throws {
        let parsed = try XCTUnwrap(parseRequest("GET /x HTTP/1.1\r\nHost: h\r\nX_Auth: a\r\nX-Auth: b\r\n\r\n"))
        XCTAssertEqual(parsed.head.fields.map(\.nameHasUnderscore), [false, true, false])
    }

    func testFieldNameSyntax() {
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\r\n: value\r\n\r\n"), .emptyFieldName)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\r\nBad Name: value\r\n\r\n"), .whitespaceBeforeColon)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\r\nContent-Length : 0\r\n\r\n"), .whitespaceBeforeColon)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\r\nNo-Colon\r\n\r\n"), .invalidFieldName)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\r\nX(y): 1\r\n\r\n"), .invalidFieldName)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\n Host: h\r\n\r\n"), .whitespaceBeforeFirstField)
    }

    func testLineEndings() throws {
        let bareLF = try XCTUnwrap(parseRequest("POST /lf HTTP/1.1\nHost: h\nContent-Length: 3\n\nabc"))
        XCTAssertEqual(bareLF.head.semantics.framing, .length(3))
        XCTAssertEqual(bareLF.head.headLength, bareLF.bytes.count - 3)
        let strict = HTTPWireLimits(allowBareLF: false)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\nHost: h\n\n", limits: strict), .bareLF)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: h\n\r\n", limits: strict), .bareLF)
        XCTAssertEqual(requestError("GET /x HTTP/1.1\rHost: h\r\n\r\n"), .invalidVersion, "bare CR ends nothing")
        // Empty lines before the request line are skipped (RFC 9112 section 2.2) and counted in the head.
        let leading = try XCTUnwrap(parseRequest("\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n"))
        XCTAssertEqual(leading.target, "/x")
        XCTAssertEqual(leading.head.headLength, leading.bytes.count)
        XCTAssertEqual(requestError("\r GET /x HTTP/1.1\r\nHost: h\r\n\r\n"), .bareCR)
    }

    func testObsFoldIsReplacedWithSpacesInPlaceOrRefused() throws {
        let text = "GET /fold HTTP/1.1\r\nHost: h\r\nX-Folded: a\r\n  b\r\nX-Next: c\r\n\r\n"
        let parsed = try XCTUnwrap(parseRequest(text))
        XCTAssertEqual(parsed.values("x-folded"), ["a    b"])
        XCTAssertEqual(parsed.values("x-next"), ["c"])
        XCTAssertEqual(requestError(text, limits: HTTPWireLimits(replaceObsFold: false)), .obsFold)
        // A folded Content-Length is still a number only if it is one.
        XCTAssertEqual(requestError("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n 0\r\n\r\n"), .invalidContentLength)
    }

    func testHostRules() throws {
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\n\r\n"), .missingHost)
        XCTAssertNil(requestError("GET /x HTTP/1.0\r\n\r\n"), "HTTP/1.0 may omit Host")
        XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: a\r\nHost: evil.example\r\n\r\n"), .duplicateHost)
        for bad in ["a b", "a,b", "a/b", "user@a", "a?b"] {
            XCTAssertEqual(requestError("GET /x HTTP/1.1\r\nHost: \(bad)\r\n\r\n"), .invalidHost, bad)
        }
        XCTAssertNil(requestError("GET /x HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"))
    }

    func testConnectionAndExpect() throws {
        let closing = try XCTUnwrap(parseRequest("GET /x HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Close\r\n\r\n"))
        XCTAssertFalse(closing.head.semantics.keepAlive)
        XCTAssertTrue(closing.head.semantics.connection.contains(.close))
        let old = try XCTUnwrap(parseRequest("GET /x HTTP/1.0\r\n\r\n"))
        XCTAssertFalse(old.head.semantics.keepAlive)
        let oldKeep = try XCTUnwrap(parseRequest("GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
        XCTAssertTrue(oldKeep.head.semantics.keepAlive)
        let other = try XCTUnwrap(parseRequest("GET /x HTTP/1.1\r\nHost: h\r\nConnection: X-Secret\r\n\r\n"))
        XCTAssertTrue(other.head.semantics.connection.contains(.otherTokens))
        let expect = try XCTUnwrap(parseRequest("POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nContent-Length: 5\r\n\r\n"))
        XCTAssertTrue(expect.head.expectsContinue)
        let odd = try XCTUnwrap(parseRequest("POST /x HTTP/1.1\r\nHost: h\r\nExpect: teapot\r\n\r\n"))
        XCTAssertTrue(odd.head.hasUnsupportedExpectation)
    }

    func testParsingAgainReusesTheFieldStorage() throws {
        var parser = HeadParser()
        var head = RequestHead()
        var first = Array("GET /1 HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\n\r\n".utf8)
        var second = Array("GET /2 HTTP/1.1\r\nHost: h\r\n\r\n".utf8)
        XCTAssertTrue(try first.withUnsafeMutableBytes { try parser.parseRequest($0, into: &head) })
        XCTAssertEqual(head.fields.count, 3)
        XCTAssertTrue(try second.withUnsafeMutableBytes { try parser.parseRequest($0, into: &head) })
        XCTAssertEqual(head.fields.count, 1)
        XCTAssertNil(head.hostField.flatMap { $0 > 0 ? $0 : nil })
    }
}
