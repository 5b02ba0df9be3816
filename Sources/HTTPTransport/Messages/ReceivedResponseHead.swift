import HTTPWire

/// A response head as received: one copy of its bytes and HTTPWire's offsets into them.
public struct ReceivedResponseHead: Sendable {
    public let bytes: [UInt8]
    public let parsed: ResponseHead

    public var status: Int { parsed.status }
    public var version: HTTPVersion { parsed.semantics.version }
    public var framing: BodyFraming { parsed.semantics.framing }
    public var reason: String { String(decoding: bytes[parsed.reason], as: UTF8.self) }

    public func forEachField(_ body: (ArraySlice<UInt8>, ArraySlice<UInt8>) -> Void) {
        for field in parsed.fields { body(bytes[field.name], bytes[field.value]) }
    }

    public func field(_ name: String) -> String? {
        let wanted = Array(name.utf8)
        for field in parsed.fields where asciiEqualIgnoringCase(bytes[field.name], wanted) {
            return String(decoding: bytes[field.value], as: UTF8.self)
        }
        return nil
    }
}
