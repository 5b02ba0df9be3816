/// Why a message was refused. Every case is a protocol error in the bytes received; the caller answers
/// (or gives up on the connection) and never guesses what the peer meant, because two parties guessing
/// differently about where a message ends is how requests are smuggled.
public enum HTTPWireError: Error, Equatable, Sendable {
    case headTooLarge
    case tooManyFields
    case bareCR
    case bareLF
    case invalidMethod
    case invalidTarget
    case invalidVersion
    case unsupportedVersion
    case invalidStatus
    case invalidReason
    case emptyFieldName
    case invalidFieldName
    case whitespaceBeforeColon
    case invalidFieldValue
    case obsFold
    case whitespaceBeforeFirstField
    case missingHost
    case duplicateHost
    case invalidHost
    case invalidContentLength
    case duplicateContentLength
    case conflictingContentLength
    case contentLengthTooLarge
    case contentLengthWithTransferEncoding
    case unsupportedTransferEncoding
    case duplicateTransferEncoding
    case transferEncodingInHTTP10
    case chunkedNotFinal
    case invalidChunkSize
    case chunkSizeTooLarge
    case invalidChunkExtension
    case chunkExtensionTooLong
    case missingCRLFAfterChunkData
    case invalidTrailer
    case trailerTooLarge

    /// One line naming the cause, safe to log and to send (it never quotes the peer's bytes).
    public var reason: String {
        switch self {
        case .headTooLarge: return "message head larger than the limit (line endings included)"
        case .tooManyFields: return "more header fields than the limit"
        case .bareCR: return "CR not followed by LF"
        case .bareLF: return "LF line ending without CR"
        case .invalidMethod: return "invalid method token"
        case .invalidTarget: return "request target is empty, contains a space, control character or DEL, or does not fit the method"
        case .invalidVersion: return "malformed HTTP version"
        case .unsupportedVersion: return "HTTP version other than 1.0 or 1.1"
        case .invalidStatus: return "malformed status code"
        case .invalidReason: return "control character in the reason phrase"
        case .emptyFieldName: return "empty header field name"
        case .invalidFieldName: return "invalid character in a header field name"
        case .whitespaceBeforeColon: return "whitespace between a header field name and the colon"
        case .invalidFieldValue: return "NUL, control character or DEL in a header field value"
        case .obsFold: return "obsolete line folding in a header field"
        case .whitespaceBeforeFirstField: return "whitespace before the first header field"
        case .missingHost: return "HTTP/1.1 request without Host"
        case .duplicateHost: return "more than one Host header field"
        case .invalidHost: return "invalid Host header field value"
        case .invalidContentLength: return "Content-Length is not a non-negative decimal number"
        case .duplicateContentLength: return "Content-Length given more than once"
        case .conflictingContentLength: return "conflicting Content-Length values"
        case .contentLengthTooLarge: return "Content-Length too large"
        case .contentLengthWithTransferEncoding: return "both Content-Length and Transfer-Encoding"
        case .unsupportedTransferEncoding: return "Transfer-Encoding other than chunked"
        case .duplicateTransferEncoding: return "Transfer-Encoding given more than once"
        case .transferEncodingInHTTP10: return "Transfer-Encoding in an HTTP/1.0 message"
        case .chunkedNotFinal: return "chunked is not the final transfer coding"
        case .invalidChunkSize: return "malformed chunk size"
        case .chunkSizeTooLarge: return "chunk size too large"
        case .invalidChunkExtension: return "control character in a chunk extension"
        case .chunkExtensionTooLong: return "chunk extension longer than the limit"
        case .missingCRLFAfterChunkData: return "chunk data not followed by CRLF"
        case .invalidTrailer: return "malformed trailer field"
        case .trailerTooLarge: return "trailer section larger than the limit"
        }
    }

    /// The status a server answers a request with when its head or body framing has this error.
    public var requestStatus: Int {
        switch self {
        case .headTooLarge, .tooManyFields: return 431
        case .unsupportedVersion: return 505
        case .unsupportedTransferEncoding: return 501
        default: return 400
        }
    }
}
