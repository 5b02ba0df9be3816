import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A listening socket on 127.0.0.1 that hands every accepted connection to `serve` on a thread of its
/// own: the shared machinery of `MiniHTTPServer` (parsed requests) and `RawUpstream` (raw bytes).
///
/// `stop()` shuts the listener and every open connection down, which wakes threads blocked in
/// `accept`/`recv`, and waits (bounded) for them. A connection's fd is closed under the lock after
/// `serve` returns, so `stop()` can never shut down a reused fd number.
final class LoopbackAcceptor: @unchecked Sendable { // mutable state is guarded by `state`
    typealias Serve = @Sendable (_ fd: Int32, _ connectionID: Int) -> Void

    let port: Int
    private let listenFD: Int32
    private let serve: Serve
    private let socketTimeout: Double
    private let state = NSCondition()
    private var stopped = false
    private var openFDs = Set<Int32>()
    private var liveThreads = 0
    private var accepted = 0
    private var listenClosed = false

    /// Connections accepted so far / currently open.
    var acceptedConnections: Int { state.lock(); defer { state.unlock() }; return accepted }
    var openConnections: Int { state.lock(); defer { state.unlock() }; return openFDs.count }
    var isStopped: Bool { state.lock(); defer { state.unlock() }; return stopped }
    /// Called on the accept thread after each accept (a census of connections across servers).
    var onAccepted: (@Sendable () -> Void)? {
        get { state.lock(); defer { state.unlock() }; return accepted_ }
        set { state.lock(); accepted_ = newValue; state.unlock() }
    }
    private var accepted_: (@Sendable () -> Void)?

    /// Open connections whose peer has not closed its side: a connection the client closed a moment ago
    /// may still be open here (its thread has not read the end yet), but its FIN has arrived, which
    /// `recv(MSG_PEEK)` sees at once. Counted at each accept, this is exact for a client that closes one
    /// connection before opening the next.
    var liveConnections: Int {
        state.lock()
        defer { state.unlock() }
        return openFDs.filter { fd in
            var byte: UInt8 = 0
            return recv(fd, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)) != 0
        }.count
    }

    /// - Parameters:
    ///   - accepting: false leaves connections in the listen queue (with `backlog` 0 connects then hang).
    ///   - socketTimeout: receive/send timeout of accepted sockets, so idle connections end eventually.
    init(backlog: Int32, accepting: Bool = true, socketTimeout: Double, serve: @escaping Serve) throws {
        (listenFD, port) = try LoopbackSocket.listen(backlog: backlog)
        self.serve = serve
        self.socketTimeout = socketTimeout
        if accepting {
            liveThreads = 1
            Thread { [self] in acceptLoop() }.start()
        }
    }

    deinit { stop() }

    /// Idempotent; waits up to 5 s for every thread.
    func stop() {
        state.lock()
        defer { state.unlock() }
        if !stopped {
            stopped = true
            shutdown(listenFD, Int32(SHUT_RDWR))
            for fd in openFDs { shutdown(fd, Int32(SHUT_RDWR)) }
            state.broadcast()
        }
        let deadline = Date(timeIntervalSinceNow: 5)
        while liveThreads > 0 && state.wait(until: deadline) {}
        if liveThreads == 0 && !listenClosed {
            listenClosed = true
            close(listenFD)
        }
    }

    /// Blocks for up to `seconds` (capped at 60) but returns at once when stopped, so a simulated slow
    /// peer never makes `stop()` wait. False if stopped meanwhile.
    @discardableResult
    func interruptibleDelay(_ seconds: Double) -> Bool {
        let deadline = Date(timeIntervalSinceNow: min(max(seconds, 0), 60))
        state.lock()
        defer { state.unlock() }
        while !stopped && state.wait(until: deadline) {}
        return !stopped
    }

    private func acceptLoop() {
        defer { state.lock(); liveThreads -= 1; state.broadcast(); state.unlock() }
        while !isStopped {
            // poll() with a timeout so the loop re-checks `stopped` even if shutdown() did not wake it.
            var pfd = pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, 200) > 0 else { continue }
            let fd = accept(listenFD, nil, nil)
            guard fd >= 0 else { continue }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC) // accept4 is not imported; keep it out of child processes
            state.lock()
            if stopped { state.unlock(); close(fd); return }
            openFDs.insert(fd)
            accepted += 1
            liveThreads += 1
            let connectionID = accepted
            let told = accepted_
            state.unlock()
            told?()
            Thread { [self] in
                LoopbackSocket.setTimeouts(fd, seconds: socketTimeout)
                serve(fd, connectionID)
                state.lock()
                openFDs.remove(fd)
                close(fd)
                liveThreads -= 1
                state.broadcast()
                state.unlock()
            }.start()
        }
    }
}
