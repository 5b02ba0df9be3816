/// HTTP/2's client connection preface (RFC 9113 §3.4), which a client with prior knowledge sends first.
enum HTTP2Preface {
    static let bytes: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    enum Match { case none, partial, complete }

    /// Whether `input` starts with the preface, could still become it, or cannot.
    static func match(_ input: UnsafeRawBufferPointer) -> Match {
        let n = min(input.count, bytes.count)
        for i in 0..<n where input[i] != bytes[i] { return .none }
        return n == bytes.count ? .complete : .partial
    }
}
