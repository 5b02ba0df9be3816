import CLibevent

/// Outgoing `evhttp_connection`s that must never carry another request, freed on the next loop pass.
///
/// A connection is retired from inside its own request callbacks (the done callback is where we learn
/// that the peer sent more than one response), and evhttp still uses the connection after that callback
/// returns: freeing it there would be a use-after-free. So it is parked here and freed once the
/// callback has unwound.
final class ConnectionRetirement {
    private var retiring: [OpaquePointer] = []
    private var sweep: LoopEvent?
    private let loop: EventLoop

    init(loop: EventLoop) {
        self.loop = loop
        sweep = LoopEvent(loop: loop) { [unowned self] _ in self.freeRetired() }
    }

    func retire(_ connection: OpaquePointer) {
        retiring.append(connection)
        sweep?.activate()
    }

    /// Bytes the peer sent beyond the complete response just read. A keep-alive connection that has
    /// them is desynchronised: the next request on it would be answered with them (a response meant for
    /// nobody, possibly forged). evhttp itself resets an idle connection that receives bytes later; only
    /// bytes that arrived together with the response are still buffered when the response completes.
    static func unreadBytes(on connection: OpaquePointer) -> Int {
        guard let bev = evhttp_connection_get_bufferevent(connection) else { return 0 }
        return EvBuffer.length(bufferevent_get_input(bev))
    }

    func freeRetired() {
        let connections = retiring
        retiring = []
        connections.forEach { evhttp_connection_free($0) }
    }

    /// The owner can go away inside the very callback that retired a connection (a pool replaced by a
    /// reload, released when its last exchange finishes): what is still parked is then handed to a
    /// one-shot event of the loop, never freed here.
    deinit {
        guard !retiring.isEmpty else { return }
        let parked = Unmanaged.passRetained(ParkedConnections(retiring)).toOpaque()
        var now = timeval(seconds: 0)
        if event_base_once(loop.base, -1, Int16(EV_TIMEOUT), freeParkedConnectionsTrampoline, parked, &now) != 0 {
            Unmanaged<ParkedConnections>.fromOpaque(parked).release()  // the loop is gone: nothing left to free them with
        }
    }
}

/// Connections handed from a departed `ConnectionRetirement` to a one-shot loop event.
final class ParkedConnections {
    let connections: [OpaquePointer]
    init(_ connections: [OpaquePointer]) { self.connections = connections }
}

private let freeParkedConnectionsTrampoline: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
    guard let context else { return }
    Unmanaged<ParkedConnections>.fromOpaque(context).takeRetainedValue().connections.forEach { evhttp_connection_free($0) }
}
