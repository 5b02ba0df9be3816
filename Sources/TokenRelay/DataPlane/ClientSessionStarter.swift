import HTTPTransport
import HTTPWire

/// The handler of every client connection of a front end until the connection's first request head:
/// only then is its `ClientSession` made and entered in the front end's table (about 280 bytes with the
/// entry), so a crowd of clients that connected and stay silent holds none. One starter per listener,
/// shared by all its connections; the connection's handler becomes the session before the head is
/// passed on, so everything after it goes to the session directly.
final class ClientSessionStarter: HTTPServerConnectionHandler {
    /// Cleared when the front end goes: connections closed after that (at exit) report to nobody.
    unowned var frontEnd: TransportFrontEnd?

    /// The route whose own listener its connections came in on (nil: the main listener).
    let listenerRoute: String?

    init(frontEnd: TransportFrontEnd, listenerRoute: String?) {
        self.frontEnd = frontEnd
        self.listenerRoute = listenerRoute
    }

    func connection(_ connection: HTTPServerConnection, receivedHead head: consuming ReceivedRequestHead) {
        guard let session = frontEnd?.startSession(on: connection, listenerRoute: listenerRoute) else { return }
        session.connection(connection, receivedHead: head)
    }

    /// Body, end and drain are reported only after a head, to the session by then.
    func connection(_ connection: HTTPServerConnection, receivedBody bytes: UnsafeRawBufferPointer) {}
    func connectionReceivedEnd(_ connection: HTTPServerConnection) {}
    func connectionCanSendMore(_ connection: HTTPServerConnection) {}

    func connectionSentHTTP2Preface(_ connection: HTTPServerConnection) {
        frontEnd?.startHTTP2(connection, listenerRoute: listenerRoute)
    }

    /// A connection that ended before its first head (a silent client that left or timed out, a slow
    /// head, one refused at the limit), or after its socket went to HTTP/2.
    func connection(_ connection: HTTPServerConnection, ended: ConnectionEnd) {
        frontEnd?.connectionEndedWithoutSession(ended)
    }
}
