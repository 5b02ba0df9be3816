/// One header field line: offsets of its name and of its value (without surrounding whitespace) in the
/// buffer the head was parsed from. Nothing is copied; the buffer must outlive the use of the offsets.
public struct FieldLine: Sendable, Equatable {
    public var name: Range<Int>
    public var value: Range<Int>
    /// "_" in the name: some servers read it as "-", so a proxy may drop such fields (nginx does by default).
    public var nameHasUnderscore: Bool

    public init(name: Range<Int>, value: Range<Int>, nameHasUnderscore: Bool) {
        self.name = name
        self.value = value
        self.nameHasUnderscore = nameHasUnderscore
    }
}

/// How the body of a message is delimited (RFC 9112 section 6.3), decided once from the whole head.
public enum BodyFraming: Sendable, Equatable {
    /// No body at all (a request without length, HEAD / 1xx / 204 / 304 responses).
    case none
    /// Exactly this many bytes follow the head.
    case length(Int)
    /// Chunked transfer coding; decode with `ChunkedDecoder`.
    case chunked
    /// The body ends when the connection closes (responses only).
    case untilClose
}

/// The four forms of request target (RFC 9112 section 3.2).
public enum TargetForm: Sendable, Equatable {
    case origin      // "/path?query"
    case absolute    // "http://host/path"
    case authority   // "host:port" (CONNECT)
    case asterisk    // "*" (OPTIONS)
}

/// Connection options named in the Connection header field(s).
public struct ConnectionOptions: OptionSet, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    public static let close = ConnectionOptions(rawValue: 1)
    public static let keepAlive = ConnectionOptions(rawValue: 2)
    public static let upgrade = ConnectionOptions(rawValue: 4)
    /// Some other token: a hop-by-hop field the proxy must drop too.
    public static let otherTokens = ConnectionOptions(rawValue: 8)
}

public struct HTTPWireLimits: Sendable {
    /// Bytes of the whole head, start line and every line ending included.
    public var maxHeadBytes: Int
    public var maxFields: Int
    /// Bytes of one chunk-size line's extensions (which are dropped).
    public var maxChunkExtensionBytes: Int
    /// Bytes of the trailer section of a chunked body (which is dropped).
    public var maxTrailerBytes: Int
    /// Accept a lone LF as a line ending (RFC 9112 section 2.2 allows it; it is unambiguous once the whole
    /// head is parsed by one parser and re-framed before it goes on).
    public var allowBareLF: Bool
    /// Replace obsolete line folding with spaces (in place) instead of refusing the message.
    public var replaceObsFold: Bool

    public init(maxHeadBytes: Int = 64 * 1024, maxFields: Int = 256, maxChunkExtensionBytes: Int = 4096,
                maxTrailerBytes: Int = 16 * 1024, allowBareLF: Bool = true, replaceObsFold: Bool = true) {
        self.maxHeadBytes = maxHeadBytes
        self.maxFields = maxFields
        self.maxChunkExtensionBytes = maxChunkExtensionBytes
        self.maxTrailerBytes = maxTrailerBytes
        self.allowBareLF = allowBareLF
        self.replaceObsFold = replaceObsFold
    }
}

/// What a head says about the connection and the body, common to requests and responses.
public struct MessageSemantics: Sendable, Equatable {
    public var version: HTTPVersion = .http11
    public var framing: BodyFraming = .none
    public var connection: ConnectionOptions = []
    /// How many Content-Length / Transfer-Encoding field lines the head had (a proxy re-frames and drops them).
    public var contentLengthCount = 0
    public var transferEncodingCount = 0

    /// Whether the connection may carry another message after this one (before the other side's say).
    public var keepAlive: Bool {
        switch version {
        case .http11: return !connection.contains(.close)
        case .http10: return connection.contains(.keepAlive) && !connection.contains(.close)
        }
    }
}

public struct RequestHead: Sendable {
    public var method: HTTPMethod = .get
    public var methodBytes: Range<Int> = 0..<0
    public var target: Range<Int> = 0..<0
    public var targetForm: TargetForm = .origin
    public var fields: [FieldLine] = []
    public var semantics = MessageSemantics()
    /// Index of the Host field in `fields`.
    public var hostField: Int?
    /// `Expect: 100-continue`.
    public var expectsContinue = false
    /// An Expect value other than 100-continue (answer 417).
    public var hasUnsupportedExpectation = false
    /// Bytes of the head, leading empty lines and the final empty line included: the body starts here.
    public var headLength = 0

    /// The field table is reserved by the first parsed head, not here (see `HeadParser`).
    public init() {}
}

public struct ResponseHead: Sendable {
    public var status = 0
    public var reason: Range<Int> = 0..<0
    public var fields: [FieldLine] = []
    public var semantics = MessageSemantics()
    public var headLength = 0

    /// 1xx: another head follows on the same connection.
    public var isInformational: Bool { status >= 100 && status < 200 }

    /// The field table is reserved by the first parsed head, not here (see `HeadParser`).
    public init() {}
}
