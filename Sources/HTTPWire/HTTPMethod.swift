/// Request methods. The standard ones are recognised without allocating; any other valid token is
/// `.other` and its bytes stay in the buffer (`RequestHead.methodBytes`).
public enum HTTPMethod: UInt8, Sendable, Equatable {
    case get, head, post, put, delete, connect, options, trace, patch, other

    /// Processing it twice is harmless by definition (RFC 9110 §9.2.2), so it may be sent again after
    /// the connection died under it.
    public var isIdempotent: Bool {
        switch self {
        case .get, .head, .options, .put, .delete, .trace: return true
        case .post, .connect, .patch, .other: return false
        }
    }

    /// Classifies the method token in `bytes[range]` (case-sensitive, as methods are).
    @inlinable
    static func classify(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) -> HTTPMethod {
        func matches(_ literal: StaticString) -> Bool {
            guard literal.utf8CodeUnitCount == range.count else { return false }
            let p = literal.utf8Start
            for i in 0..<range.count where p[i] != bytes[range.lowerBound + i] { return false }
            return true
        }
        switch range.count {
        case 3: return matches("GET") ? .get : matches("PUT") ? .put : .other
        case 4: return matches("POST") ? .post : matches("HEAD") ? .head : .other
        case 5: return matches("PATCH") ? .patch : matches("TRACE") ? .trace : .other
        case 6: return matches("DELETE") ? .delete : .other
        case 7: return matches("OPTIONS") ? .options : matches("CONNECT") ? .connect : .other
        default: return .other
        }
    }

    /// The method for a name as sent on the wire (case-sensitive, like methods).
    public init(name: String) {
        var copy = name
        self = copy.withUTF8 { HTTPMethod.classify(UnsafeRawBufferPointer($0), 0..<$0.count) }
    }

    /// The method name, for a known method.
    public var name: StaticString? {
        switch self {
        case .get: return "GET"
        case .head: return "HEAD"
        case .post: return "POST"
        case .put: return "PUT"
        case .delete: return "DELETE"
        case .connect: return "CONNECT"
        case .options: return "OPTIONS"
        case .trace: return "TRACE"
        case .patch: return "PATCH"
        case .other: return nil
        }
    }
}

/// HTTP/1.0 or HTTP/1.1: the only versions a message may carry (others are refused while parsing).
public enum HTTPVersion: UInt8, Sendable, Equatable {
    case http10, http11
}
