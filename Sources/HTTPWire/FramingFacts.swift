/// What the framing-relevant fields said, gathered while parsing and judged once the head is complete.
struct FramingFacts {
    var contentLength: Int?
    var contentLengthCount = 0
    var contentLengthWasList = false
    var transferEncodingCount = 0
    var codings = 0
    var lastCodingIsChunked = false
    var connection: ConnectionOptions = []

    /// Digits only (no sign, no hex, no spaces inside); a list is allowed only of identical values.
    /// A second field or list element with another value is a conflict; the same value again is recorded
    /// as a duplicate (requests refuse it, responses accept it).
    mutating func addContentLength(_ bytes: UnsafeRawBufferPointer, _ value: Range<Int>) throws(HTTPWireError) {
        contentLengthCount &+= 1
        var elements = 0
        try forEachListElement(bytes, value) { element throws(HTTPWireError) in
            elements &+= 1
            guard !element.isEmpty else { throw .invalidContentLength }
            var length = 0
            for i in element {
                guard isDigit(bytes[i]) else { throw .invalidContentLength }
                let (times10, o1) = length.multipliedReportingOverflow(by: 10)
                let (sum, o2) = times10.addingReportingOverflow(Int(bytes[i] &- 0x30))
                guard !o1, !o2 else { throw .contentLengthTooLarge }
                length = sum
            }
            if let existing = contentLength, existing != length { throw .conflictingContentLength }
            contentLength = length
        }
        if elements == 0 { throw .invalidContentLength }
        if elements > 1 { contentLengthWasList = true }
    }

    mutating func addTransferEncoding(_ bytes: UnsafeRawBufferPointer, _ value: Range<Int>) throws(HTTPWireError) {
        transferEncodingCount &+= 1
        var this = self
        try forEachListElement(bytes, value) { element throws(HTTPWireError) in
            // Nothing may follow chunked: the body's end would be ambiguous.
            if this.lastCodingIsChunked { throw .chunkedNotFinal }
            guard !element.isEmpty else { throw .unsupportedTransferEncoding }
            this.codings &+= 1
            this.lastCodingIsChunked = equalsIgnoringCase(bytes, element, "chunked")
        }
        self = this
    }

    mutating func addConnection(_ bytes: UnsafeRawBufferPointer, _ value: Range<Int>) {
        // The usual values whole (a value is trimmed): what the list walk below would find in them.
        if equalsIgnoringCase(bytes, value, "keep-alive") {
            connection.insert(.keepAlive)
            return
        }
        if equalsIgnoringCase(bytes, value, "close") {
            connection.insert(.close)
            return
        }
        var options = connection
        // A malformed list element cannot harm: unknown tokens only make the proxy drop more fields.
        try? forEachListElement(bytes, value) { element throws(HTTPWireError) in
            if element.isEmpty { return }
            if equalsIgnoringCase(bytes, element, "close") { options.insert(.close) }
            else if equalsIgnoringCase(bytes, element, "keep-alive") { options.insert(.keepAlive) }
            else if equalsIgnoringCase(bytes, element, "upgrade") { options.insert(.upgrade) }
            else { options.insert(.otherTokens) }
        }
        connection = options
    }
}

/// Calls `body` with each comma-separated element of a field value, without surrounding whitespace.
/// Empty elements (", ,") are passed as empty ranges.
func forEachListElement(_ bytes: UnsafeRawBufferPointer, _ value: Range<Int>,
                        _ body: (Range<Int>) throws(HTTPWireError) -> Void) throws(HTTPWireError) {
    var start = value.lowerBound
    var i = value.lowerBound
    while i <= value.upperBound {
        if i == value.upperBound || bytes[i] == UInt8(ascii: ",") {
            try body(trimmed(bytes, start..<i))
            start = i &+ 1
        }
        i &+= 1
    }
}
