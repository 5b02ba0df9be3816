import HTTPWire

/// What a server connection needs only once its client has sent something: the head parser and the
/// parsed head it fills, the last head's bytes and the chunked decoder. Made with the first bytes and
/// then kept for the connection's life, so a keep-alive client pays one allocation for it, not one per
/// request, and a client that connects and stays silent (10,000 of them in bench/idle-rss.sh) holds
/// none of it: about 270 bytes less each.
final class RequestScratch {
    var parser: HeadParser
    var head = RequestHead()
    /// The last request head's bytes, handed to the handler (see `refillHeadBytes`).
    var headBytes: [UInt8] = []
    var chunked: ChunkedDecoder

    init(limits: HTTPWireLimits) {
        parser = HeadParser(limits: limits)
        chunked = ChunkedDecoder(limits: limits)
    }
}

extension HTTPServerConnection {
    /// For tests: the request scratch has been made (a silent connection has none).
    var holdsRequestScratch: Bool { scratchIfMade != nil }
}
