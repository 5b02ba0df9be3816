import Foundation
import HTTPTransport
import HTTPWire

/// An HTTPServer on 127.0.0.1 run by its own loop thread, with a handler that answers by path:
///   /echo          200, body "METHOD target\n" + the request body
///   /peer          200, body = the peer address the transport saw
///   /stream?N      200, N bytes of a repeating pattern sent with unknown length (chunked to 1.1)
///                  in 64 KiB pieces, only while the connection can take more (backpressure)
///   /known?N       the same with a known length
///   /hold          no answer until `answerHeld()` (a busy connection)
///   /continue      sends 100 Continue when the head arrives (the handler decides), then echoes
///   /early         answers 401 as soon as the head arrives, without reading the body
///   /paused        pauses reading when the head arrives; `resumePaused()` resumes, then echoes
/// Every other path echoes; no path sends 100 Continue by itself.
final class TransportTestServer: @unchecked Sendable {
    let port: UInt16
    private let loop: TransportLoop
    private(set) var server: HTTPServer!
    /// With `sharedLimitListener`: a second listener on the same loop, same handler, whose connections
    /// count against one limit with the first's (`ConnectionLimitGroup`).
    private(set) var secondServer: HTTPServer?
    var secondPort: UInt16 { secondServer?.port ?? 0 }
    private var queue: [() -> Void] = []
    private var _limitEvents: [HTTPServer.LimitEvent] = []
    private var _received: [String] = []
    /// Limit events in order (any thread).
    var limitEvents: [HTTPServer.LimitEvent] { lock.withLock { _limitEvents } }
    /// "head /path", "body N" and "end" per request, in order (any thread).
    var received: [String] { lock.withLock { _received } }
    func note(_ event: String) { lock.withLock { _received.append(event) } }
    private var handlers: [ObjectIdentifier: EchoHandler] = [:]
    private let thread: Thread
    private let stopped = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var _ends: [ConnectionEnd] = []
    private var _maxPendingSeen = 0

    /// How connections ended, in order (for tests that check protocol errors).
    var ends: [ConnectionEnd] { lock.withLock { _ends } }

    /// The last connection end, waiting (bounded) for one to be reported: the loop thread reports an end
    /// after writing the answer the test thread may already have read.
    func lastEnd(within seconds: Double = 5) -> ConnectionEnd? {
        let deadline = Date().addingTimeInterval(seconds)
        while ends.isEmpty && Date() < deadline { usleep(1000) }
        return ends.last
    }

    convenience init(host: String = "127.0.0.1", headTimeout: Double = 10) throws {
        try self.init(host: host, settings: HTTPServer.Settings(headTimeout: headTimeout))
    }

    init(host: String = "127.0.0.1", settings: HTTPServer.Settings, sharedLimitListener: Bool = false) throws {
        let loop = try TransportLoop()
        self.loop = loop
        let box = ServerBox()
        let group = sharedLimitListener ? ConnectionLimitGroup() : nil
        let accepted: (HTTPServerConnection) -> Void = { connection in
            let handler = EchoHandler(owner: box)
            box.server?.keep(handler, for: connection)
            connection.handler = handler
        }
        server = try HTTPServer(loop: loop, host: host, port: 0, settings: settings, limitGroup: group, onConnection: accepted)
        port = server.port
        server.onLimitEvent = { event in box.server?.lock.withLock { box.server?._limitEvents.append(event) } }
        if sharedLimitListener {
            secondServer = try HTTPServer(loop: loop, host: host, port: 0, settings: settings, limitGroup: group, onConnection: accepted)
            secondServer?.onLimitEvent = server.onLimitEvent
        }
        let handle = TransportLoopHandle(loop)
        let done = stopped
        thread = Thread {
            handle.loop.run()
            done.signal()
        }
        box.server = self
        loop.onWake { [unowned self] in
            let work = self.lock.withLock { () -> [() -> Void] in
                defer { self.queue.removeAll() }
                return self.queue
            }
            for item in work { item() }
        }
        thread.start()
    }

    /// Runs `work` on the loop thread and waits (bounded) for its result.
    func sync<T>(_ work: @escaping (TransportTestServer) -> T) -> T {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox<T>()
        lock.withLock { queue.append { box.value = work(self); done.signal() } }
        loop.wake()
        _ = done.wait(timeout: .now() + 10)
        return box.value!
    }

    /// Answers every request to /hold so far (loop thread does it; this waits).
    func answerHeld() {
        sync { server in for handler in server.handlers.values { handler.answerHold() } }
    }

    /// Resumes reading on every connection paused by /paused.
    func resumePaused() {
        sync { server in for handler in server.handlers.values { handler.resume() } }
    }

    var openConnections: Int { sync { $0.server.openConnections } }

    func keep(_ handler: EchoHandler, for connection: HTTPServerConnection) {
        handlers[ObjectIdentifier(connection)] = handler
        connections[ObjectIdentifier(connection)] = connection
    }

    /// The open connections (loop thread: inside `sync`).
    private(set) var connections: [ObjectIdentifier: HTTPServerConnection] = [:]

    func connectionEnded(_ connection: HTTPServerConnection, _ end: ConnectionEnd) {
        handlers[ObjectIdentifier(connection)] = nil
        connections[ObjectIdentifier(connection)] = nil
        lock.withLock { _ends.append(end) }
    }

    /// Stops the loop thread, then closes the listener and its connections (the loop is no longer running,
    /// so this thread may touch them) before the loop itself can be freed.
    func stop() {
        lock.withLock { queue.append { [loop] in loop.stop() } }
        loop.wake()
        _ = stopped.wait(timeout: .now() + 10)
        server.close()
        secondServer?.close()
        handlers.removeAll()
        connections.removeAll()
        server = nil
        secondServer = nil
    }
}

final class ServerBox: @unchecked Sendable {
    weak var server: TransportTestServer?
}

final class EchoHandler: HTTPServerConnectionHandler {
    private let owner: ServerBox
    private var head: ReceivedRequestHead?
    private var body: [UInt8] = []
    private var streamRemaining = 0
    private var streaming = false
    private weak var current: HTTPServerConnection?
    private var holding = false
    private var answered = false

    init(owner: ServerBox) { self.owner = owner }

    private func path(of head: ReceivedRequestHead) -> String {
        let target = String(decoding: head.target, as: UTF8.self)
        return target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? target
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: ReceivedRequestHead) {
        self.head = head
        body = []
        current = connection
        answered = false
        owner.server?.note("head \(path(of: head))")
        switch path(of: head) {
        case "/continue":
            connection.sendContinue()
            connection.sendContinue()   // once only
        case "/early":
            answered = true
            connection.respond(HTTPResponseHead(status: 401, reason: "Unauthorized"), body: Array("no\n".utf8))
        case "/paused":
            connection.pauseReading()
        default:
            break
        }
    }

    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        body.append(contentsOf: bytes)
        owner.server?.note("body \(bytes.count)")
    }

    func answerHold() {
        guard holding, let current else { return }
        holding = false
        current.respond(HTTPResponseHead(status: 200, reason: "OK"), body: Array("held\n".utf8))
    }

    func resume() { current?.resumeReading() }

    func connectionReceivedEnd(_ connection: HTTPServerConnection) {
        guard let head else { return }
        owner.server?.note("end")
        guard !answered else { return }
        let target = String(decoding: head.target, as: UTF8.self)
        let path = path(of: head)
        let query = target.split(separator: "?", maxSplits: 1).dropFirst().first.flatMap { Int($0) } ?? 0
        switch path {
        case "/hold":
            holding = true
        case "/overlong":
            // Says 3 bytes, tries to send 9: the extra must never reach the client.
            connection.startResponse(HTTPResponseHead(status: 200, reason: "OK"), body: .known(3))
            connection.sendBody(Array("abcHTTP/1".utf8))
            connection.finishResponse()
        case "/short":
            // Says 10 bytes, sends 3: the connection must close rather than leave the client waiting.
            connection.startResponse(HTTPResponseHead(status: 200, reason: "OK"), body: .known(10))
            connection.sendBody(Array("abc".utf8))
            connection.finishResponse()
        case "/peer":
            connection.respond(HTTPResponseHead(status: 200, reason: "OK"), body: Array(connection.peer.description.utf8))
        case "/stream", "/known":
            connection.startResponse(HTTPResponseHead(status: 200, reason: "OK", fields: [("Content-Type", "application/octet-stream")]),
                                     body: path == "/known" ? .known(query) : .unknown)
            streamRemaining = query
            streaming = true
            pump(connection)
        default:
            var reply = Array("\(head.methodName) \(target)\n".utf8)
            reply.append(contentsOf: body)
            connection.respond(HTTPResponseHead(status: 200, reason: "OK", fields: [("Content-Type", "text/plain"), ("Bad\r\nName", "x"), ("X-Split", "a\r\nInjected: 1")]),
                               body: reply)
        }
    }

    /// Sends pattern bytes while the connection can take them; the rest on connectionCanSendMore.
    private func pump(_ connection: HTTPServerConnection) {
        while streaming && connection.canSendMore {
            let n = min(65536, streamRemaining)
            if n == 0 {
                streaming = false
                connection.finishResponse()
                return
            }
            streamRemaining -= n
            patternBlock.withUnsafeBytes { connection.sendBody(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
    }

    func connectionCanSendMore(_ connection: HTTPServerConnection) {
        pump(connection)
    }

    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        owner.server?.connectionEnded(connection, ended)
    }
}

/// /stream and /known send this 64 KiB block over and over (the last piece cut short).
let patternBlock: [UInt8] = (0..<65536).map { UInt8(truncatingIfNeeded: $0 % 251) }

/// The bytes /stream?N and /known?N send, for comparison.
func expectedPattern(_ total: Int) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(total)
    while out.count < total { out.append(contentsOf: patternBlock[0..<min(65536, total - out.count)]) }
    return out
}
