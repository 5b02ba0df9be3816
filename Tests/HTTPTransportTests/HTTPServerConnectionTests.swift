import Glibc
import HTTPTransport
import HTTPWire
import XCTest

/// The transport's server side over real sockets on 127.0.0.1.
final class HTTPServerConnectionTests: XCTestCase {
    private var server: TransportTestServer!

    override func setUpWithError() throws {
        server = try TransportTestServer()
    }

    override func tearDown() {
        server.stop()
        server = nil
    }

    func testKeepAliveConnectionServesRequestsInTurn() throws {
        let client = try LoopbackClient(port: server.port)
        for i in 0..<3 {
            try client.send("GET /echo?\(i) HTTP/1.1\r\nHost: h\r\n\r\n")
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 200)
            XCTAssertEqual(String(decoding: response.body, as: UTF8.self), "GET /echo?\(i)\n")
            XCTAssertFalse(response.head.lowercased().contains("connection: close"))
        }
    }

    /// A listen address may name a host ("localhost:8081" in `admin.listen`): the evhttp listener resolved
    /// it, and `check` accepts it, so the transport's listener must not refuse it at start.
    func testListenAddressMayBeAHostName() throws {
        let named = try TransportTestServer(host: "localhost")
        defer { named.stop() }
        var addresses: UnsafeMutablePointer<addrinfo>?
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        XCTAssertEqual(getaddrinfo("localhost", String(named.port), &hints, &addresses), 0)
        defer { freeaddrinfo(addresses) }
        // The listener is on one of the name's addresses: a client that tries them in turn gets through.
        var answered = false
        var entry = addresses
        while let current = entry, !answered {
            let fd = socket(current.pointee.ai_family, Int32(SOCK_STREAM.rawValue), 0)
            if connect(fd, current.pointee.ai_addr, current.pointee.ai_addrlen) == 0 {
                let request = Array("GET /echo HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".utf8)
                _ = request.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                var tv = timeval(tv_sec: 5, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
                var buffer = [UInt8](repeating: 0, count: 64)
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                answered = n > 0 && String(decoding: buffer[0..<max(0, n)], as: UTF8.self).hasPrefix("HTTP/1.1 200")
            }
            close(fd)
            entry = current.pointee.ai_next
        }
        XCTAssertTrue(answered, "no address of localhost answered on port \(named.port)")
    }

    func testPeerAddressComesFromAccept() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /peer HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertTrue(String(decoding: try client.readResponse().body, as: UTF8.self).hasPrefix("127.0.0.1:"))
    }

    func testRequestBodiesByLengthAndChunked() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "POST /echo\nhello")
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-T: 1\r\n\r\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "POST /echo\nabcde")
        // Body split across writes.
        try client.send("PUT /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\nab")
        try client.send("cdef")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "PUT /echo\nabcdef")
    }

    func testPipelinedRequestsAreAnsweredInOrder() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /echo?1 HTTP/1.1\r\nHost: h\r\n\r\nPOST /echo?2 HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nxGET /echo?3 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "GET /echo?1\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "POST /echo?2\nx")
        let last = try client.readResponse()
        XCTAssertEqual(String(decoding: last.body, as: UTF8.self), "GET /echo?3\n")
        XCTAssertTrue(last.head.contains("Connection: close"))
        XCTAssertTrue(client.readEOF())
    }

    func testOutgoingFieldsCannotSplitTheHead() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /echo HTTP/1.1\r\nHost: h\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertTrue(response.head.contains("Content-Type: text/plain\r\n"))
        XCTAssertFalse(response.head.contains("Injected"), response.head)
        XCTAssertFalse(response.head.contains("Bad"), response.head)
    }

    func testProtocolErrorsAreAnsweredAndClose() throws {
        let cases: [(String, Int)] = [
            ("POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("GET /a\rAuthorization: Bearer stolen\r HTTP/1.1\r\nHost: h\r\n\r\n", 400),
            ("GET /x HTTP/1.1\r\nHost: h\r\nX-A: b\u{0}c\r\n\r\n", 400),
            ("GET /x HTTP/1.2\r\nHost: h\r\n\r\n", 505),
            ("POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", 400),
            ("GET /x HTTP/1.1\r\nHost: h\r\n" + String(repeating: "X:1\r\n", count: 20_000) + "\r\n", 431),
        ]
        for (request, status) in cases {
            let client = try LoopbackClient(port: server.port)
            try? client.send(request)
            let response = try client.readResponse()
            XCTAssertEqual(response.status, status, request.prefix(60).debugDescription)
            XCTAssertTrue(response.head.contains("Connection: close"))
            XCTAssertTrue(client.readEOF())
        }
    }

    func testHTTP10ClientGetsACloseDelimitedStreamAndKeepAliveWhenAsked() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /stream?70000 HTTP/1.0\r\n\r\n")
        let response = try client.readResponse()
        XCTAssertFalse(response.head.lowercased().contains("transfer-encoding"))
        XCTAssertEqual(response.body, expectedPattern(70000))

        let keep = try LoopbackClient(port: server.port)
        try keep.send("GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        XCTAssertTrue(try keep.readResponse().head.contains("Connection: keep-alive"))
        try keep.send("GET /echo?2 HTTP/1.0\r\n\r\n")
        XCTAssertEqual(String(decoding: try keep.readResponse().body, as: UTF8.self), "GET /echo?2\n")
        XCTAssertTrue(keep.readEOF())
    }

    /// 8 MiB to a client that reads only after the server had to wait: every byte arrives, in order,
    /// through the write-when-blocked path and the handler's backpressure.
    func testLargeResponsesStreamWithBackpressure() throws {
        for path in ["/stream", "/known"] {
            let client = try LoopbackClient(port: server.port)
            try client.send("GET \(path)?8388608 HTTP/1.1\r\nHost: h\r\n\r\n")
            let response = try client.readResponse()
            XCTAssertEqual(response.status, 200)
            XCTAssertEqual(response.body.count, 8 << 20, path)
            XCTAssertTrue(response.body == expectedPattern(8 << 20), path)
        }
    }

    func testHalfClosedClientStillGetsItsResponse() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nok")
        client.shutdownWrite()
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "POST /echo\nok")
        XCTAssertTrue(client.readEOF())
    }
}

extension HTTPServerConnectionTests {
    /// A client still uploading a refused body reads the whole answer: the server drains and drops the
    /// rest instead of closing with unread input (which would reset the connection under the answer).
    func testRefusalWhileTheClientIsStillSendingIsReadable() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        let response = try client.readResponse()
        XCTAssertEqual(response.status, 400)
        // The server has answered and shut its side; more upload must not reset the connection.
        for _ in 0..<16 { try client.send([UInt8](repeating: 0x61, count: 16384)) }
        XCTAssertTrue(client.readEOF())
        XCTAssertEqual(server.lastEnd(), .protocolError(.invalidChunkSize))
    }
}

extension HTTPServerConnectionTests {
    func testResponseToHEADCarriesTheLengthButNoBody() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("HEAD /known?5000 HTTP/1.1\r\nHost: h\r\n\r\nGET /echo?after HTTP/1.1\r\nHost: h\r\n\r\n")
        // The HEAD response's head says 5000 bytes; LoopbackClient would wait for them, so read raw: the
        // next bytes after the head must be the next response, not a body.
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while !String(decoding: received, as: UTF8.self).contains("GET /echo?after\n") {
            let n = chunk.withUnsafeMutableBytes { read(client.fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            received.append(contentsOf: chunk[0..<n])
        }
        let text = String(decoding: received, as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("HTTP/1.1 200 OK\r\n"), text)
        XCTAssertTrue(text.contains("Content-Length: 5000\r\n"), text)
        let afterHead = text.components(separatedBy: "\r\n\r\n").dropFirst().first ?? ""
        XCTAssertTrue(afterHead.hasPrefix("HTTP/1.1 200 OK"), "no body bytes after a HEAD response: \(afterHead.prefix(40))")
    }
}

extension HTTPServerConnectionTests {
    /// A pipeline of heads and bodies (length, chunked with extensions and trailers) delivered one byte
    /// per write, so that reads end at every possible boundary: the answers are the same as in one piece.
    func testEveryReadBoundaryGivesTheSameAnswers() throws {
        let pipeline = "POST /echo?1 HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nabcd"
            + "PUT /echo?2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nef\r\n1\r\ng\r\n0\r\nT: 1\r\n\r\n"
            + "GET /echo?3 HTTP/1.1\r\nHost: h\r\nX-Folded: a\r\n b\r\n\r\n"
        let client = try LoopbackClient(port: server.port)
        var one: Int32 = 1
        setsockopt(client.fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        for byte in pipeline.utf8 { try client.send([byte]) }
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "POST /echo?1\nabcd")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "PUT /echo?2\nefg")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "GET /echo?3\n")
    }
}

extension HTTPServerConnectionTests {
    /// A sender that gets its length wrong cannot desynchronise the client: extra bytes are dropped, a
    /// short body ends the connection.
    func testAnnouncedLengthIsHeldToBothWays() throws {
        let client = try LoopbackClient(port: server.port)
        try client.send("GET /overlong HTTP/1.1\r\nHost: h\r\n\r\nGET /echo?next HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "abc")
        XCTAssertEqual(String(decoding: try client.readResponse().body, as: UTF8.self), "GET /echo?next\n")

        let short = try LoopbackClient(port: server.port)
        try short.send("GET /short HTTP/1.1\r\nHost: h\r\n\r\n")
        XCTAssertThrowsError(try short.readResponse(), "closed in the body")
    }
}
