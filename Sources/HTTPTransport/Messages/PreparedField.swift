/// A field made once and written into many heads: the upstream's `Host`, the token header of one token, a
/// fixed forwarding field. Checked when made, exactly as `HTTPFieldBlock.append(name:value:)` checks every
/// field (a name that is not a token, a value with a control character, a framing field: no prepared field
/// at all), so that writing it into a head is one copy, with no String and no second look at its bytes.
/// A value that comes from outside (a configuration, a token endpoint) is thus still judged before any
/// head holds it, once instead of once per request.
public struct PreparedField: Sendable {
    /// "Name: value" and CR LF, as the head will hold it.
    let line: [UInt8]
    /// Named Expect: left out of a head whose Expect the transport writes itself.
    let isExpect: Bool

    /// Nil for a field that is not sendable (see above).
    public init?(name: String, value: String) {
        let sendable = withBytes(of: name) { name in withBytes(of: value) { value in isSendableFieldName(name) && hasNoControls(value) } }
        guard sendable else { return nil }
        isExpect = asciiEqualIgnoringCase(name, "expect")
        line = Array(name.utf8) + Array(": ".utf8) + Array(value.utf8) + [0x0D, 0x0A]
    }
}

extension HTTPFieldBlock {
    /// Adds a prepared field (checked when it was made).
    public mutating func append(_ field: PreparedField) {
        guard !(dropsExpect && field.isExpect), !isWritingField else { return }
        field.line.withUnsafeBytes { buffer.append($0) }
    }
}
