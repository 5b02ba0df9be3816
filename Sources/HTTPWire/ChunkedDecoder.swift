/// Decodes a chunked body (RFC 9112 section 7.1) as bytes arrive, handing out the data in place.
///
/// Chunk extensions are accepted and dropped (a proxy re-frames the body, and no extension is defined that
/// it must keep); trailer fields are checked for syntax and dropped. Sizes are strict: hex digits only,
/// at least one, no sign, prefix or leading whitespace, and a value that would overflow is an error, never
/// a wrapped or clamped length.
public struct ChunkedDecoder: Sendable {
    enum State: Sendable, Equatable {
        case sizeStart
        case size
        case sizeWhitespace      // BWS between the size and ";"
        case extensions
        case sizeLF
        case data
        case dataCR
        case dataLF
        case trailerLineStart
        case trailerName
        case trailerValue
        case trailerLF
        case finalLF
        case complete
    }

    public var limits: HTTPWireLimits
    private var state = State.sizeStart
    private var chunkSize = 0
    private var remaining = 0
    private var extensionBytes = 0
    private var trailerBytes = 0

    public init(limits: HTTPWireLimits = HTTPWireLimits()) {
        self.limits = limits
    }

    /// The final chunk and the trailer section (if any) have been consumed.
    public var isComplete: Bool { state == .complete }

    /// Body bytes of the current chunk still to come (for read sizing).
    public var remainingInChunk: Int { state == .data ? remaining : 0 }

    /// Consumes bytes from `input` and passes each run of body data to `onData` (a slice of `input`).
    /// Returns how many bytes were consumed: all of them, unless the body ended earlier, in which case the
    /// rest belongs to the next message.
    public mutating func decode(_ input: UnsafeRawBufferPointer, onData: (UnsafeRawBufferPointer) -> Void) throws(HTTPWireError) -> Int {
        var i = 0
        let n = input.count
        while i < n {
            let b = input[i]
            switch state {
            case .complete:
                return i
            case .sizeStart:
                guard let digit = hexValue(b) else { throw .invalidChunkSize }
                chunkSize = digit
                state = .size
            case .size:
                if let digit = hexValue(b) {
                    // Sixteen hex digits would reach Int's sign bit; refuse before shifting.
                    guard chunkSize <= (Int.max >> 4) else { throw .chunkSizeTooLarge }
                    chunkSize = (chunkSize << 4) | digit
                } else {
                    try endOfSize(b)
                }
            case .sizeWhitespace:
                if isWhitespace(b) { break }
                guard b == UInt8(ascii: ";") else { throw .invalidChunkSize }
                extensionBytes = 0
                state = .extensions
            case .extensions:
                if b == CR { state = .sizeLF; break }
                if b == LF { try bareLF(); try sizeLineDone(); break }
                guard isFieldValueByte(b) else { throw .invalidChunkExtension }
                extensionBytes &+= 1
                guard extensionBytes <= limits.maxChunkExtensionBytes else { throw .chunkExtensionTooLong }
            case .sizeLF:
                guard b == LF else { throw .bareCR }
                try sizeLineDone()
            case .data:
                let take = min(remaining, n &- i)
                onData(UnsafeRawBufferPointer(rebasing: input[i..<(i &+ take)]))
                remaining &-= take
                if remaining == 0 { state = .dataCR }
                i &+= take
                continue
            case .dataCR:
                if b == CR { state = .dataLF }
                else if b == LF && limits.allowBareLF { state = .sizeStart }
                else { throw .missingCRLFAfterChunkData }
            case .dataLF:
                guard b == LF else { throw .missingCRLFAfterChunkData }
                state = .sizeStart
            case .trailerLineStart:
                if b == CR { state = .finalLF; break }
                if b == LF { try bareLF(); state = .complete; i &+= 1; return i }
                guard isTokenByte(b) else { throw .invalidTrailer }
                try countTrailerByte()
                state = .trailerName
            case .trailerName:
                try countTrailerByte()
                if b == UInt8(ascii: ":") { state = .trailerValue; break }
                guard isTokenByte(b) else { throw .invalidTrailer }
            case .trailerValue:
                try countTrailerByte()
                if b == CR { state = .trailerLF; break }
                if b == LF { try bareLF(); state = .trailerLineStart; break }
                guard isFieldValueByte(b) else { throw .invalidTrailer }
            case .trailerLF:
                guard b == LF else { throw .bareCR }
                try countTrailerByte()
                state = .trailerLineStart
            case .finalLF:
                guard b == LF else { throw .bareCR }
                state = .complete
                return i &+ 1
            }
            i &+= 1
        }
        return i
    }

    /// A byte after the size digits: ";" starts extensions, BWS may precede it, CR/LF end the line.
    private mutating func endOfSize(_ b: UInt8) throws(HTTPWireError) {
        switch b {
        case UInt8(ascii: ";"): extensionBytes = 0; state = .extensions
        case SP, HTAB: state = .sizeWhitespace
        case CR: state = .sizeLF
        case LF: try bareLF(); try sizeLineDone()
        default: throw .invalidChunkSize
        }
    }

    private mutating func sizeLineDone() throws(HTTPWireError) {
        if chunkSize == 0 {
            trailerBytes = 0
            state = .trailerLineStart
        } else {
            remaining = chunkSize
            state = .data
        }
    }

    private func bareLF() throws(HTTPWireError) {
        guard limits.allowBareLF else { throw .bareLF }
    }

    private mutating func countTrailerByte() throws(HTTPWireError) {
        trailerBytes &+= 1
        guard trailerBytes <= limits.maxTrailerBytes else { throw .trailerTooLarge }
    }
}
