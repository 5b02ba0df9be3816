/// A connect timeout separate from the response timeout.
///
/// evhttp 2.1 has a single timeout per connection for connect, send and read (docs/evhttp.md, one-timeout; separate
/// ones exist only in libevent master). A dead upstream host should fail in seconds, while a slow API
/// may legitimately take a minute to answer, so the connect phase gets its own timer: if the connection
/// has no established TCP connection when it fires, the request is given up. A TLS handshake that
/// stalls after the TCP connect is bounded by the response timeout instead.
final class ConnectWatchdog {
    private var timer: LoopEvent?

    /// Does nothing for a connection that is already established (a reused keep-alive connection).
    init(loop: EventLoop, connection: OpaquePointer, seconds: Double, onTimeout: @escaping () -> Void) {
        guard !HTTPConnectionFactory.isConnected(connection) else { return }
        let timer = LoopEvent(loop: loop) { _ in
            if !HTTPConnectionFactory.isConnected(connection) { onTimeout() }
        }
        timer.schedule(after: seconds)
        self.timer = timer
    }
}
