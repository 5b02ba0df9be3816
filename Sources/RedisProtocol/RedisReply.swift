import FoundationEssentials

/// One reply from Redis, copied out of hiredis' reply objects (no C memory outlives the reader call).
public enum RedisReply: Equatable, Sendable {
    case status(String)
    case error(String)
    case integer(Int64)
    case string(Data)
    case null
    case array([RedisReply])

    /// A bulk string, status or integer as text; nil for the rest.
    public var text: String? {
        switch self {
        case .string(let data): return String(decoding: data, as: UTF8.self)
        case .status(let text): return text
        case .integer(let value): return String(value)
        default: return nil
        }
    }

    /// An integer reply, or a string or status that spells one.
    public var integer: Int64? {
        switch self {
        case .integer(let value): return value
        case .string, .status: return text.flatMap { Int64($0) }
        default: return nil
        }
    }
}
