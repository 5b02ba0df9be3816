import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A small threaded HTTP/1.1 server on 127.0.0.1 (ephemeral port) that the fake upstreams build on.
///
/// Deliberately simple and independent of the product (no libevent): one accept thread, one thread
/// per connection, blocking sockets. A test-support server must be obviously correct rather than
/// fast, and a different implementation from the product's avoids bugs cancelling out. Listen
/// backlog is 512 so bursts of 50+ concurrent connections are queued, not reset.
final class MiniHTTPServer: @unchecked Sendable {
    typealias Handler = @Sendable (RecordedRequest) -> TestResponse

    /// What the server does with a request head that carries `Expect: 100-continue` (RFC 9110 §10.1.1).
    enum ExpectationAnswer: Sendable {
        /// `100 Continue`, then the body is read (the default).
        case sendContinue
        /// No interim answer: the body is read as if nothing had been asked (an old server).
        case ignore
        /// A final answer instead of 100; the body is not read, and the connection closes after the answer
        /// (whether the body follows cannot be known).
        case answer(TestResponse)
    }
    typealias ExpectationHandler = @Sendable (RecordedRequest) -> ExpectationAnswer

    var port: Int { acceptor.port }
    var baseURL: String { "http://127.0.0.1:\(port)" }
    private var acceptor: LoopbackAcceptor!
    private let handler: Handler
    private let expectation: ExpectationHandler?

    /// Number of TCP connections accepted so far (connection reuse checks).
    var acceptedConnections: Int { acceptor.acceptedConnections }
    /// Number of connections currently open.
    var openConnections: Int { acceptor.openConnections }
    /// Open connections whose client has not closed them (see `LoopbackAcceptor.liveConnections`).
    var liveConnections: Int { acceptor.liveConnections }
    /// Called after each accept.
    var onAccepted: (@Sendable () -> Void)? {
        get { acceptor.onAccepted }
        set { acceptor.onAccepted = newValue }
    }

    /// `expectation`: consulted for a head with `Expect: 100-continue` (its body empty); nil sends 100.
    init(expectation: ExpectationHandler? = nil, handler: @escaping Handler) throws {
        self.handler = handler
        self.expectation = expectation
        acceptor = try LoopbackAcceptor(backlog: 512, socketTimeout: 120) { [weak self] fd, id in self?.serve(fd: fd, connectionID: id) }
    }

    deinit { acceptor?.stop() }

    /// Closes the listener and every open connection, and waits (bounded, 5 s) for all threads.
    /// Idempotent. Handlers blocked in `interruptibleDelay` are woken.
    func stop() { acceptor.stop() }

    /// Blocks for up to `seconds` (capped at 60) but returns at once when the server stops. Use it
    /// to simulate a slow upstream without making stop() wait for the delay. Returns false if the
    /// server stopped meanwhile (the handler should then not change any state).
    @discardableResult
    func interruptibleDelay(_ seconds: Double) -> Bool { acceptor.interruptibleDelay(seconds) }

    private var isStopped: Bool { acceptor.isStopped }

    /// Serves requests on one connection until the client closes, asks to close, or the server stops.
    private func serve(fd: Int32, connectionID: Int) {
        let reader = SocketReader(fd: fd)
        while !isStopped {
            let request: RecordedRequest
            do {
                switch try readRequest(reader, fd: fd, connectionID: connectionID) {
                case nil: return
                case .request(let parsed)?: request = parsed
                case .answeredBeforeBody(let response)?:
                    try? write(response, to: fd, connection: "close", headOnly: false)
                    return
                }
            } catch {
                if !isStopped {
                    let body = Data("bad request: \(error)\n".utf8)
                    try? write(TestResponse(status: 400, body: body), to: fd, connection: "close", headOnly: false)
                }
                return
            }
            let response = handler(request)
            let close = wantsClose(request) || response.headers.contains {
                $0.0.lowercased() == "connection" && $0.1.lowercased().contains("close")
            }
            let connectionHeader = close ? "close" : (request.version == "HTTP/1.0" ? "keep-alive" : nil)
            do { try write(response, to: fd, connection: connectionHeader, headOnly: request.method == "HEAD") } catch { return }
            if close { return }
        }
    }

    private enum Incoming {
        case request(RecordedRequest)
        /// The head's `Expect: 100-continue` got a final answer; the body was not read.
        case answeredBeforeBody(TestResponse)
    }

    private func readRequest(_ reader: SocketReader, fd: Int32, connectionID: Int) throws -> Incoming? {
        var line = ""
        for _ in 0..<3 where line.isEmpty { // RFC 9112 §2.2: ignore a stray CRLF before a request
            guard let next = try reader.readLine() else { return nil }
            line = next
        }
        let parts = line.split(separator: " ", omittingEmptySubsequences: true)
        guard parts.count == 3, parts[2].hasPrefix("HTTP/1.") else { throw TestSupportError("bad request line: \(line)") }
        let head = RecordedRequest(method: String(parts[0]), target: String(parts[1]), version: String(parts[2]),
                                   headers: try reader.readHeaderFields(), body: Data(),
                                   connectionID: connectionID, wasChunked: false)
        if head.version == "HTTP/1.1" && head.header("Expect")?.lowercased() == "100-continue" {
            switch expectation?(head) ?? .sendContinue {
            case .sendContinue: try LoopbackSocket.writeAll(fd, Data("HTTP/1.1 100 Continue\r\n\r\n".utf8))
            case .ignore: break
            case .answer(let response): return .answeredBeforeBody(response)
            }
        }
        let chunked = head.headerTokens("Transfer-Encoding").last == "chunked"
        var body = Data()
        if chunked {
            body = try reader.readChunkedBody()
        } else if let lengthText = head.header("Content-Length") {
            guard let length = Int(lengthText.trimmingCharacters(in: .whitespaces)) else {
                throw TestSupportError("bad Content-Length: \(lengthText)")
            }
            body = try reader.readExactly(length)
        }
        return .request(RecordedRequest(method: head.method, target: head.target, version: head.version,
                                        headers: head.headers, body: body, connectionID: connectionID, wasChunked: chunked))
    }

    /// HTTP/1.1 is persistent unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
    private func wantsClose(_ request: RecordedRequest) -> Bool {
        let tokens = request.headerTokens("Connection")
        return request.version == "HTTP/1.0" ? !tokens.contains("keep-alive") : tokens.contains("close")
    }

    private func write(_ response: TestResponse, to fd: Int32, connection: String?, headOnly: Bool) throws {
        var head = "HTTP/1.1 \(response.status) \(response.reason)\r\n"
        for (name, value) in response.headers
        where !["content-length", "transfer-encoding", "connection"].contains(name.lowercased()) {
            head += "\(name): \(value)\r\n"
        }
        let hasBody = response.status != 204 && response.status != 304 && !(100..<200).contains(response.status)
        if response.status != 204 { head += "Content-Length: \(response.body.count)\r\n" }
        head += connection.map { "Connection: \($0)\r\n\r\n" } ?? "\r\n"
        var bytes = Data(head.utf8)
        if hasBody && !headOnly { bytes.append(response.body) }
        try LoopbackSocket.writeAll(fd, bytes)
    }
}
