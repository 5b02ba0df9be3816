import HTTPTransport
import HTTPWire

/// The client side of one exchange: an HTTP/1.1 connection's current request, or an HTTP/2 stream. The
/// exchange answers through it alike; what only HTTP/1.1 can do (a 101 and a tunnel, splicing a body
/// socket to socket) is reached through `http1Connection`, nil for a stream.
protocol ExchangeClient: AnyObject {
    var closeAfterResponse: Bool { get set }
    var canSendMore: Bool { get }
    var http1Connection: HTTPServerConnection? { get }
    func startResponse(status: Int, reason: UnsafeRawBufferPointer, body: BodyLength, fields: (inout HTTPFieldBlock) -> Void)
    func sendBody(_ bytes: UnsafeRawBufferPointer)
    func finishResponse()
    /// Ends the response with trailer fields (HTTP/2; an HTTP/1.1 client's response ends without them).
    func finishResponse(trailers: [(name: String, value: String)])
    /// The request's trailer fields (HTTP/2 only; an HTTP/1.1 request's chunked trailers are not kept).
    var requestTrailers: [(name: String, value: String)] { get }
    func flushPendingHead()
    func withdrawUnsentResponse() -> Bool
    func respond(_ response: HTTPResponseHead, body: [UInt8])
    func respond(status: Int, reason: UnsafeRawBufferPointer, body: [UInt8], fields: (inout HTTPFieldBlock) -> Void)
    /// Ends the exchange for the client without a complete answer (HTTP/1.1: the connection closes;
    /// HTTP/2: the stream is reset).
    func close()
    func endIfPeerLeftWhilePaused() -> Bool
    func endIfPeerHalfClosed() -> Bool
    func pauseReading()
    func resumeReading()
    func sendContinue()
}

extension HTTPServerConnection: ExchangeClient {
    var http1Connection: HTTPServerConnection? { self }
    /// Trailers are dropped: an HTTP/1.1 client of a relayed response gets none.
    func finishResponse(trailers: [(name: String, value: String)]) { finishResponse() }
    var requestTrailers: [(name: String, value: String)] { [] }
}

extension HTTP2ServerStream: ExchangeClient {
    var http1Connection: HTTPServerConnection? { nil }
    /// Other streams of the connection go on: the next request's start is never in doubt in HTTP/2.
    var closeAfterResponse: Bool {
        get { false }
        set {}
    }
    /// The head goes out at once (nghttp2 queues it): there is no unsent head to take back.
    func flushPendingHead() {}
    func withdrawUnsentResponse() -> Bool { false }
    func close() { reset() }
    /// nghttp2 reads the connection whatever a stream's window: a reset while held is reported at once.
    func endIfPeerLeftWhilePaused() -> Bool { false }
    func endIfPeerHalfClosed() -> Bool { false }
    func finishResponse() { finishResponse(trailers: []) }
}

/// Where an exchange lives: the HTTP/1.1 client session, or one HTTP/2 stream's. It lends the exchange
/// its timers and target buffer, names the client for the forwarding headers, and passes the upstream
/// connection's reports on to the exchange (`upstream.handler` is the session).
protocol ExchangeSession: HTTPClientConnectionHandler {
    associatedtype Client: ExchangeClient
    var client: Client { get }
    var forwardedClient: ForwardedClient { get }
    /// The route whose own listener the request came in on (nil: the main listener).
    var listenerRoute: String? { get }
    func lendDeadlineTimer() -> DeadlineTimer
    func returnDeadlineTimer(_ timer: DeadlineTimer)
    func lendTargetBuffer() -> [UInt8]
    func returnTargetBuffer(_ buffer: inout [UInt8])
    func exchangeFinished(_ finished: RelayedExchange<Self>)
}
