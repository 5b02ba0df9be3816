/// A handler that stands between an upstream connection and whoever the reports are for at the moment:
/// it passes every report on to `reportTarget`, and drops it when there is none. Two owners need that
/// indirection because a connection holds its handler strongly: a client session, whose connection outlives
/// one exchange and must report to the current one; and a one-shot exchange, which must not be kept alive by
/// its own connection (the forwarder holds it weakly). Generic, not an existential, so the forwarding is a
/// direct call once specialised (the session's is on every proxied request).
public protocol HTTPClientConnectionReportForwarding: HTTPClientConnectionHandler {
    associatedtype ReportTarget: HTTPClientConnectionHandler
    var reportTarget: ReportTarget? { get }
}

extension HTTPClientConnectionReportForwarding {
    @inlinable
    public func connection(_ connection: HTTPClientConnection, receivedInformational status: Int) {
        reportTarget?.connection(connection, receivedInformational: status)
    }

    @inlinable
    public func connection(_ connection: HTTPClientConnection, receivedHead head: ReceivedResponseHead) {
        reportTarget?.connection(connection, receivedHead: head)
    }

    @inlinable
    public func connection(_ connection: HTTPClientConnection, receivedBody bytes: UnsafeRawBufferPointer) {
        reportTarget?.connection(connection, receivedBody: bytes)
    }

    @inlinable
    public func connectionReceivedEnd(_ connection: HTTPClientConnection) {
        reportTarget?.connectionReceivedEnd(connection)
    }

    @inlinable
    public func connectionCanSendMore(_ connection: HTTPClientConnection) {
        reportTarget?.connectionCanSendMore(connection)
    }

    @inlinable
    public func connection(_ connection: HTTPClientConnection, ended: ConnectionEnd, responseStarted: Bool) {
        reportTarget?.connection(connection, ended: ended, responseStarted: responseStarted)
    }
}
