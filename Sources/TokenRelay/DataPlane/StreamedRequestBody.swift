import HTTPTransport
import HTTPWire

/// A request body too large to keep for a replay (over `limits.max_body_bytes`): piped from the client to
/// the upstream as it arrives, with backpressure both ways, never kept whole.
///
/// The client is read only while the body may flow: from the upstream's `100 Continue` (or the end of the
/// wait for it) until the body ends, and only while the upstream can take more. Until then the body waits
/// in the client's socket, so a 401 that comes before the body was asked for costs nothing: the request
/// can be sent again and the body still flows once. What had to be read before the body could flow (the
/// part of a chunked body that was buffered before it crossed the limit, or what one read had already
/// taken when reading paused) is kept in `pending` and goes first: at most the limit plus one read.
final class StreamedRequestBody {
    private let client: any ExchangeClient
    /// How the body goes upstream: `.known(n)` for a client's `Content-Length`, `.unknown` (chunked) otherwise.
    let length: BodyLength
    private var pending: [UInt8]
    private var clientEnded = false
    /// Where the request is being sent, from `attach` until `detach`: an HTTP/1.1 connection or an HTTP/2 stream.
    private var upstream: Sink?

    enum Sink {
        case connection(HTTPClientConnection)
        case stream(HTTP2ClientStream)

        func sendBody(_ bytes: UnsafeRawBufferPointer) {
            switch self {
            case .connection(let connection): connection.sendBody(bytes)
            case .stream(let stream): stream.sendBody(bytes)
            }
        }

        func finishRequest() {
            switch self {
            case .connection(let connection): connection.finishRequest()
            case .stream(let stream): stream.finishRequest()
            }
        }

        var canSendMore: Bool {
            switch self {
            case .connection(let connection): connection.canSendMore
            case .stream(let stream): stream.canSendMore
            }
        }
    }
    private var flowing = false
    private var finishedUpstream = false
    /// Told each time body bytes are handed to the upstream.
    var onProgress: (() -> Void)?

    init(client: any ExchangeClient, length: BodyLength, prefix: [UInt8]) {
        self.client = client
        self.length = length
        pending = prefix
        client.pauseReading()
    }

    // MARK: - The upstream side

    /// The request head has gone out on `connection` with `Expect: 100-continue`; the body waits for
    /// `upstreamCanTakeMore`.
    func attach(_ connection: HTTPClientConnection) {
        upstream = .connection(connection)
        flowing = false
        finishedUpstream = false
        client.pauseReading()
    }

    /// The request head has gone out on an HTTP/2 stream. With `expect: 100-continue` (the stream's
    /// `continueState` waiting) the body waits as on HTTP/1.1; otherwise (a gRPC call) it flows at once,
    /// held back by flow control only, and a refusal after its first bytes is the client's.
    func attach(_ stream: HTTP2ClientStream) {
        upstream = .stream(stream)
        finishedUpstream = false
        flowing = stream.continueState != .waiting
        guard flowing else { return client.pauseReading() }
        client.sendContinue()
        pump()
    }

    /// The HTTP/2 stream can take body bytes (again): after its 100, the end of the wait for it, or room.
    func upstreamCanTakeMore(_ stream: HTTP2ClientStream) {
        guard case .stream(let current) = upstream, current === stream else { return }
        if !flowing {
            guard stream.continueState == .received || stream.continueState == .waitExpired else { return }
            flowing = true
            client.sendContinue()
        }
        pump()
    }

    /// The connection is no longer this request's (its answer is complete, or it failed or was closed):
    /// nothing more is sent to it, and the client is not read for it.
    func detach() {
        upstream = nil
        flowing = false
        if !clientEnded { client.pauseReading() }
    }

    /// The connection can take body bytes: after `100 Continue`, after the wait for it expired, or when
    /// bytes that had to wait were written. A final answer that came first (`finalResponseFirst`) leaves
    /// the body where it is.
    func upstreamCanTakeMore(_ connection: HTTPClientConnection) {
        guard case .connection(let current) = upstream, current === connection else { return }
        if !flowing {
            guard connection.continueState == .received || connection.continueState == .waitExpired else { return }
            flowing = true
            // The client's own `Expect: 100-continue` is answered now, when its body can go somewhere.
            client.sendContinue()
        }
        pump()
    }

    private func pump() {
        guard flowing, let upstream else { return }
        if !pending.isEmpty {
            // Kept bytes go first, and at once: the upstream's send buffer takes them (they are bounded).
            let bytes = pending
            pending = []
            hand(bytes.count) { bytes.withUnsafeBytes { upstream.sendBody($0) } }
        }
        if clientEnded {
            if !finishedUpstream {
                finishedUpstream = true
                upstream.finishRequest()
            }
        } else if upstream.canSendMore {
            client.resumeReading()
        } else {
            client.pauseReading()
        }
    }

    private func hand(_ count: Int, _ send: () -> Void) {
        guard count > 0 else { return }
        send()
        onProgress?()
    }

    // MARK: - The client side

    /// A piece of the body from the client: straight to the upstream while the body flows and the
    /// upstream can take it, kept for later otherwise (what one read had already taken when reading
    /// paused).
    func received(_ bytes: UnsafeRawBufferPointer) {
        guard flowing, let upstream, pending.isEmpty else {
            pending.append(contentsOf: bytes)
            client.pauseReading()
            return
        }
        hand(bytes.count) { upstream.sendBody(bytes) }
        if !upstream.canSendMore { client.pauseReading() }
    }

    /// The client's body is complete.
    func clientFinished() {
        clientEnded = true
        // The end may come in the read that paused: the connection must read again for the next request.
        client.resumeReading()
        pump()
    }
}
