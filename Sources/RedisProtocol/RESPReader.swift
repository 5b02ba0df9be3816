import CHiredis
import FoundationEssentials

/// hiredis' RESP reply reader: bytes go in as they arrive, complete replies come out one at a time, and a
/// reply cut across reads is kept until its rest comes. Not thread-safe; one per connection.
public final class RESPReader {
    public struct MalformedReply: Error, CustomStringConvertible {
        public var description: String { "malformed reply from Redis" }
    }

    private let reader: UnsafeMutablePointer<redisReader>

    public init() {
        // redisReaderCreate fails only when malloc does; Redis cannot be talked to then anyway.
        guard let reader = redisReaderCreate() else { fatalError("redisReaderCreate: out of memory") }
        self.reader = reader
    }

    deinit {
        redisReaderFree(reader)
    }

    /// Adds received bytes (hiredis copies them). Throws when the reader is in its error state.
    public func feed(_ bytes: UnsafeRawBufferPointer) throws(MalformedReply) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        guard redisReaderFeed(reader, base.assumingMemoryBound(to: CChar.self), bytes.count) == REDIS_OK else { throw MalformedReply() }
    }

    /// The next complete reply, or nil until more bytes arrive. Throws on bytes that are not RESP (the
    /// connection cannot be resynchronised after that: its owner closes it).
    public func nextReply() throws(MalformedReply) -> RedisReply? {
        var raw: UnsafeMutableRawPointer?
        guard redisReaderGetReply(reader, &raw) == REDIS_OK else { throw MalformedReply() }
        guard let raw else { return nil }
        defer { freeReplyObject(raw) }
        return Self.copy(raw.assumingMemoryBound(to: redisReply.self))
    }

    private static func copy(_ reply: UnsafeMutablePointer<redisReply>) -> RedisReply {
        let value = reply.pointee
        func bytes() -> Data { value.str.map { Data(bytes: $0, count: value.len) } ?? Data() }
        switch value.type {
        case REDIS_REPLY_STRING: return .string(bytes())
        case REDIS_REPLY_STATUS: return .status(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_ERROR: return .error(String(decoding: bytes(), as: UTF8.self))
        case REDIS_REPLY_INTEGER: return .integer(value.integer)
        case REDIS_REPLY_ARRAY:
            guard let elements = value.element else { return .array([]) }
            return .array((0..<value.elements).map { index in elements[index].map(copy) ?? .null })
        default: return .null
        }
    }
}
