import HTTPWire

/// The field lines of a received head, read in place: the head's bytes and the offsets HTTPWire found in
/// them. Valid only inside the `withFields` call that lends it.
///
/// Only the transport makes one, and only from a head its strict parser accepted: every name is a token
/// and every value is free of controls but HTAB (a folded value had its line breaks turned into spaces
/// before the head was handed on). That is what lets `HTTPFieldBlock.appendReceived` write such a field
/// into an outgoing head without reading its bytes again.
public struct ReceivedFields {
    /// The whole head's bytes; `lines` are offsets into them.
    public let bytes: UnsafeRawBufferPointer
    public let lines: [FieldLine]
    /// What the `Connection` fields list, as HTTPWire classified each element while parsing.
    public let connection: ConnectionOptions

    /// Not public (usable from inlined code only): bytes that did not pass the parser must never be taken
    /// for received ones.
    @usableFromInline
    init(bytes: UnsafeRawBufferPointer, lines: [FieldLine], connection: ConnectionOptions) {
        self.bytes = bytes
        self.lines = lines
        self.connection = connection
    }

    // Inlinable, as `withFields` below: the header rules call these for every field of every head, and a
    // call into this module for each would cost more than the work.
    @inlinable
    public var count: Int { lines.count }

    @inlinable
    public func name(_ index: Int) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: bytes[lines[index].name]) }

    @inlinable
    public func value(_ index: Int) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: bytes[lines[index].value]) }
}

extension ReceivedRequestHead {
    /// Calls `body` with the head's fields read in place.
    @inlinable
    public func withFields<R>(_ body: (ReceivedFields) -> R) -> R {
        bytes.withUnsafeBytes { body(ReceivedFields(bytes: $0, lines: parsed.fields, connection: parsed.semantics.connection)) }
    }
}

extension ReceivedResponseHead {
    /// Calls `body` with the head's fields read in place (`bytes` also holds the reason phrase).
    @inlinable
    public func withFields<R>(_ body: (ReceivedFields) -> R) -> R {
        bytes.withUnsafeBytes { body(ReceivedFields(bytes: $0, lines: parsed.fields, connection: parsed.semantics.connection)) }
    }
}
