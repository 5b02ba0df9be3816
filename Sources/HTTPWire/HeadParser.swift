/// Parses HTTP/1.1 request and response heads (RFC 9112) in place: the result is offsets into the caller's
/// buffer, and a reused `fields` array, so a steady-state connection allocates nothing per message.
///
/// Call `parseRequest`/`parseResponse` each time more bytes arrived; `false` means the head is not complete
/// yet. The search for the end of the head resumes where the previous call stopped, so a head that arrives
/// one byte at a time costs linear time. Once complete, the parser is ready for the next message.
///
/// Strictness is the point: when a proxy and the server behind it disagree about where a message ends,
/// one client's bytes become another request. Anything that could be read two ways is an error.
public struct HeadParser: Sendable {
    public var limits: HTTPWireLimits
    /// Offset from which the search for the end of the head continues.
    private var scanResume = 0

    public init(limits: HTTPWireLimits = HTTPWireLimits()) {
        self.limits = limits
    }

    /// Forget a partly received head (the connection moved on or was reset).
    public mutating func reset() { scanResume = 0 }

    // MARK: - Requests

    public mutating func parseRequest(_ buffer: UnsafeMutableRawBufferPointer, into head: inout RequestHead) throws(HTTPWireError) -> Bool {
        var lineEnds = LineEnds()
        guard let (start, end) = try findHead(buffer, lineEnds: &lineEnds) else { return false }
        let bytes = UnsafeRawBufferPointer(buffer)
        emptyKeepingCapacity(&head.fields)
        head.semantics = MessageSemantics()
        head.hostField = nil
        head.expectsContinue = false
        head.hasUnsupportedExpectation = false
        head.headLength = end

        let (lineEnd, next) = try lineBounds(bytes, from: start, headEnd: end, lineEnds: &lineEnds)
        try parseRequestLine(bytes, start..<lineEnd, into: &head)
        var framing = FramingFacts()
        try parseFields(buffer, from: next, headEnd: end, lineEnds: &lineEnds, fields: &head.fields, facts: &framing) { fieldIndex, name, value throws(HTTPWireError) in
            if equalsIgnoringCase(bytes, name, "host") {
                guard head.hostField == nil else { throw .duplicateHost }
                try validateHost(bytes, value)
                head.hostField = fieldIndex
            } else if equalsIgnoringCase(bytes, name, "expect") {
                if equalsIgnoringCase(bytes, value, "100-continue") { head.expectsContinue = true }
                else if !value.isEmpty { head.hasUnsupportedExpectation = true }
            }
        }
        if head.semantics.version == .http11 && head.hostField == nil { throw .missingHost }
        head.semantics.connection = framing.connection
        head.semantics.contentLengthCount = framing.contentLengthCount
        head.semantics.transferEncodingCount = framing.transferEncodingCount
        head.semantics.framing = try requestFraming(framing, version: head.semantics.version)
        return true
    }

    /// Whether the start of a request head that has not ended yet can already be told to be no HTTP
    /// request: after any empty lines, its first bytes are not a method token followed by a space (binary
    /// garbage, a TLS handshake sent to the plain port). The whole head would be refused too, so a server
    /// may answer 400 at once instead of waiting for a line end that may never come. True for a prefix means
    /// true for every longer input, and such an input is never parsed as a request.
    public static func requestCannotBeHTTP(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var i = 0
        let n = bytes.count
        while i < n && (bytes[i] == CR || bytes[i] == LF) { i &+= 1 }
        let methodStart = i
        while i < n && isTokenByte(bytes[i]) { i &+= 1 }
        guard i < n else { return false }
        return bytes[i] != SP || i == methodStart
    }

    private func parseRequestLine(_ bytes: UnsafeRawBufferPointer, _ line: Range<Int>, into head: inout RequestHead) throws(HTTPWireError) {
        var i = line.lowerBound
        while i < line.upperBound && isTokenByte(bytes[i]) { i &+= 1 }
        guard i > line.lowerBound, i < line.upperBound, bytes[i] == SP else { throw .invalidMethod }
        head.methodBytes = line.lowerBound..<i
        head.method = HTTPMethod.classify(bytes, head.methodBytes)
        i &+= 1
        let targetStart = i
        while i < line.upperBound && bytes[i] != SP {
            guard isTargetByte(bytes[i]) else { throw .invalidTarget }
            i &+= 1
        }
        guard i > targetStart, i < line.upperBound else { throw i == targetStart ? .invalidTarget : .invalidVersion }
        head.target = targetStart..<i
        head.semantics.version = try parseVersion(bytes, (i &+ 1)..<line.upperBound)
        head.targetForm = try targetForm(bytes, head.target, method: head.method)
    }

    /// The form of the target, which must fit the method: authority-form only for CONNECT (and CONNECT
    /// only with it), asterisk-form only for OPTIONS, otherwise origin-form or absolute-form.
    private func targetForm(_ bytes: UnsafeRawBufferPointer, _ target: Range<Int>, method: HTTPMethod) throws(HTTPWireError) -> TargetForm {
        let first = bytes[target.lowerBound]
        if method == .connect {
            guard first != UInt8(ascii: "/"), first != UInt8(ascii: "*") else { throw .invalidTarget }
            return .authority
        }
        if first == UInt8(ascii: "/") { return .origin }
        if target.count == 1 && first == UInt8(ascii: "*") {
            guard method == .options else { throw .invalidTarget }
            return .asterisk
        }
        // absolute-form: scheme ":" hier-part, scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
        guard isAlpha(first) else { throw .invalidTarget }
        var i = target.lowerBound &+ 1
        while i < target.upperBound {
            let b = bytes[i]
            if b == UInt8(ascii: ":") { return .absolute }
            guard isAlpha(b) || isDigit(b) || b == UInt8(ascii: "+") || b == UInt8(ascii: "-") || b == UInt8(ascii: ".") else { break }
            i &+= 1
        }
        throw .invalidTarget
    }

    private func validateHost(_ bytes: UnsafeRawBufferPointer, _ value: Range<Int>) throws(HTTPWireError) {
        // uri-host [":" port]: no whitespace, no list, no path or userinfo.
        for i in value where isRefusedInHost(bytes[i]) { throw .invalidHost }
    }

    private func requestFraming(_ facts: FramingFacts, version: HTTPVersion) throws(HTTPWireError) -> BodyFraming {
        if facts.transferEncodingCount > 0 {
            if version == .http10 { throw .transferEncodingInHTTP10 }
            if facts.contentLength != nil { throw .contentLengthWithTransferEncoding }
            if facts.transferEncodingCount > 1 { throw .duplicateTransferEncoding }
            // A request body must be exactly "chunked": a server that does not know another coding
            // cannot find the end of the body, and one that does may disagree with the next hop.
            guard facts.codings == 1 && facts.lastCodingIsChunked else { throw .unsupportedTransferEncoding }
            return .chunked
        }
        if let length = facts.contentLength {
            if facts.contentLengthCount > 1 { throw .duplicateContentLength }
            if facts.contentLengthWasList { throw .invalidContentLength }
            return length == 0 ? .none : .length(length)
        }
        return .none
    }

    // MARK: - Responses

    /// `requestMethod` decides whether a body follows (none after HEAD, nor after a 2xx to CONNECT).
    public mutating func parseResponse(_ buffer: UnsafeMutableRawBufferPointer, requestMethod: HTTPMethod, into head: inout ResponseHead) throws(HTTPWireError) -> Bool {
        var lineEnds = LineEnds()
        guard let (start, end) = try findHead(buffer, lineEnds: &lineEnds) else { return false }
        let bytes = UnsafeRawBufferPointer(buffer)
        emptyKeepingCapacity(&head.fields)
        head.semantics = MessageSemantics()
        head.headLength = end

        let (lineEnd, next) = try lineBounds(bytes, from: start, headEnd: end, lineEnds: &lineEnds)
        try parseStatusLine(bytes, start..<lineEnd, into: &head)
        var facts = FramingFacts()
        try parseFields(buffer, from: next, headEnd: end, lineEnds: &lineEnds, fields: &head.fields, facts: &facts) { _, _, _ throws(HTTPWireError) in }
        head.semantics.connection = facts.connection
        head.semantics.contentLengthCount = facts.contentLengthCount
        head.semantics.transferEncodingCount = facts.transferEncodingCount
        head.semantics.framing = try responseFraming(facts, head: head, requestMethod: requestMethod)
        return true
    }

    private func parseStatusLine(_ bytes: UnsafeRawBufferPointer, _ line: Range<Int>, into head: inout ResponseHead) throws(HTTPWireError) {
        guard line.count >= 8 else { throw .invalidVersion }
        let versionEnd = line.lowerBound &+ 8
        head.semantics.version = try parseVersion(bytes, line.lowerBound..<versionEnd)
        guard line.count >= 12, bytes[versionEnd] == SP else { throw .invalidStatus }
        var status = 0
        for i in (versionEnd &+ 1)..<(versionEnd &+ 4) {
            guard isDigit(bytes[i]) else { throw .invalidStatus }
            status = status &* 10 &+ Int(bytes[i] &- 0x30)
        }
        guard status >= 100 && status <= 599 else { throw .invalidStatus }
        head.status = status
        let afterCode = versionEnd &+ 4
        if afterCode == line.upperBound {
            head.reason = afterCode..<afterCode   // "HTTP/1.1 200" without the space: seen in the wild, unambiguous
            return
        }
        guard bytes[afterCode] == SP else { throw .invalidStatus }
        for i in (afterCode &+ 1)..<line.upperBound where !isFieldValueByte(bytes[i]) { throw .invalidReason }
        head.reason = (afterCode &+ 1)..<line.upperBound
    }

    private func responseFraming(_ facts: FramingFacts, head: ResponseHead, requestMethod: HTTPMethod) throws(HTTPWireError) -> BodyFraming {
        // Framing fields are checked even where no body follows: a response that contradicts itself
        // is not relayed as-is in any case.
        if facts.transferEncodingCount > 0 {
            if head.semantics.version == .http10 { throw .transferEncodingInHTTP10 }
            if facts.contentLength != nil { throw .contentLengthWithTransferEncoding }
        }
        let status = head.status
        if status < 200 || status == 204 || status == 304 || requestMethod == .head { return .none }
        if requestMethod == .connect && status < 300 { return .none }
        if facts.transferEncodingCount > 0 {
            // Another final coding (gzip alone, say) means the body ends at the close (RFC 9112 6.3 item 4).
            return facts.lastCodingIsChunked ? .chunked : .untilClose
        }
        if let length = facts.contentLength { return .length(length) }
        return .untilClose
    }

    // MARK: - Shared

    /// Skips leading empty lines (RFC 9112 section 2.2) and finds the end of the head. Returns nil while
    /// incomplete; throws once the head is over the limit whether or not its end has arrived. The line feeds
    /// it meets go to `lineEnds` (see `LineEnds`).
    private mutating func findHead(_ buffer: UnsafeMutableRawBufferPointer, lineEnds: inout LineEnds) throws(HTTPWireError) -> (start: Int, end: Int)? {
        let bytes = UnsafeRawBufferPointer(buffer)
        let n = bytes.count
        var start = 0
        while start < n {
            if bytes[start] == LF {
                guard limits.allowBareLF else { throw .bareLF }
                start &+= 1
            } else if bytes[start] == CR {
                guard start &+ 1 < n else { return try incomplete(n) }
                guard bytes[start &+ 1] == LF else { throw .bareCR }
                start &+= 2
            } else {
                break
            }
        }
        // The end is an LF followed by LF or by CR LF. Positions before scanResume were already searched.
        var i = max(start, scanResume)
        lineEnds.begin(fromHeadStart: i == start)
        while true {
            i = firstLF(bytes, from: i, to: n)
            if i &+ 1 >= n { break }   // no LF, or one whose follower has not arrived: rescanned next time
            lineEnds.record(i)
            if bytes[i &+ 1] == LF {
                lineEnds.record(i &+ 1)
                return try complete(start, i &+ 2)
            }
            if bytes[i &+ 1] == CR {
                if i &+ 2 >= n { break }
                if bytes[i &+ 2] == LF {
                    lineEnds.record(i &+ 2)
                    return try complete(start, i &+ 3)
                }
            }
            i &+= 1
        }
        scanResume = min(i, n)
        return try incomplete(n)
    }

    private mutating func complete(_ start: Int, _ end: Int) throws(HTTPWireError) -> (start: Int, end: Int) {
        scanResume = 0
        guard end <= limits.maxHeadBytes else { throw .headTooLarge }
        return (start, end)
    }

    private func incomplete(_ received: Int) throws(HTTPWireError) -> (start: Int, end: Int)? {
        if received >= limits.maxHeadBytes { throw .headTooLarge }
        return nil
    }

    /// The line starting at `from`: the end of its content and the start of the next line.
    private func lineBounds(_ bytes: UnsafeRawBufferPointer, from: Int, headEnd: Int,
                            lineEnds: inout LineEnds) throws(HTTPWireError) -> (contentEnd: Int, next: Int) {
        let i = lineEnds.lineFeed(in: bytes, from: from, to: headEnd)
        // findHead guarantees an LF before headEnd.
        if i > from && bytes[i &- 1] == CR { return (i &- 1, i &+ 1) }
        guard limits.allowBareLF else { throw .bareLF }
        return (i, i &+ 1)
    }

    private func parseVersion(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) throws(HTTPWireError) -> HTTPVersion {
        guard range.count == 8 else { throw .invalidVersion }
        let b = range.lowerBound
        guard bytes[b] == UInt8(ascii: "H"), bytes[b &+ 1] == UInt8(ascii: "T"), bytes[b &+ 2] == UInt8(ascii: "T"),
              bytes[b &+ 3] == UInt8(ascii: "P"), bytes[b &+ 4] == UInt8(ascii: "/"), isDigit(bytes[b &+ 5]),
              bytes[b &+ 6] == UInt8(ascii: "."), isDigit(bytes[b &+ 7]) else { throw .invalidVersion }
        guard bytes[b &+ 5] == UInt8(ascii: "1") else { throw .unsupportedVersion }
        switch bytes[b &+ 7] {
        case UInt8(ascii: "0"): return .http10
        case UInt8(ascii: "1"): return .http11
        default: throw .unsupportedVersion
        }
    }

    /// Field lines from `from` up to the empty line that ends the head. `onField` sees each field once it is
    /// complete (after any folded continuation lines).
    private func parseFields(_ buffer: UnsafeMutableRawBufferPointer, from: Int, headEnd: Int, lineEnds: inout LineEnds,
                             fields: inout [FieldLine],
                             facts: inout FramingFacts,
                             onField: (Int, Range<Int>, Range<Int>) throws(HTTPWireError) -> Void) throws(HTTPWireError) {
        // Reserved when the first head arrives, not when the head value is made (with each connection): a
        // connection that never sends a request (pre-opened by a client, idle) holds no field table, and
        // every later head reuses this one.
        if fields.capacity < 32 { fields.reserveCapacity(32) }
        let bytes = UnsafeRawBufferPointer(buffer)
        var lineStart = from
        var previousTerminator = 0..<0   // the line ending before the current line, for folding
        while true {
            let (contentEnd, next) = try lineBounds(bytes, from: lineStart, headEnd: headEnd, lineEnds: &lineEnds)
            if contentEnd == lineStart { break }   // the empty line
            if isWhitespace(bytes[lineStart]) {
                // obs-fold: a continuation of the previous field's value.
                guard !fields.isEmpty else { throw .whitespaceBeforeFirstField }
                guard limits.replaceObsFold else { throw .obsFold }
                for i in lineStart..<contentEnd where !isFieldValueByte(bytes[i]) { throw .invalidFieldValue }
                for i in previousTerminator { buffer[i] = SP }
                let continuation = trimmed(bytes, lineStart..<contentEnd)
                if !continuation.isEmpty {
                    let last = fields.count &- 1
                    let valueStart = fields[last].value.isEmpty ? continuation.lowerBound : fields[last].value.lowerBound
                    fields[last].value = valueStart..<continuation.upperBound
                }
            } else {
                if !fields.isEmpty {
                    let last = fields.count &- 1
                    try noteField(bytes, fields[last], at: last, facts: &facts, onField: onField)
                }
                guard fields.count < limits.maxFields else { throw .tooManyFields }
                fields.append(try parseFieldLine(bytes, lineStart..<contentEnd))
            }
            previousTerminator = contentEnd..<next
            lineStart = next
        }
        if !fields.isEmpty {
            let last = fields.count &- 1
            try noteField(bytes, fields[last], at: last, facts: &facts, onField: onField)
        }
    }

    private func parseFieldLine(_ bytes: UnsafeRawBufferPointer, _ line: Range<Int>) throws(HTTPWireError) -> FieldLine {
        var i = line.lowerBound
        var underscore = false
        // Nearly every name is letters, digits and "-" up to the first colon: judged a word at a time, it
        // ends where the byte loop below would stop (":" is no tchar). Anything else goes byte by byte.
        let colon = firstIndex(of: UInt8(ascii: ":"), in: bytes, from: line.lowerBound, to: line.upperBound)
        if colon < line.upperBound && isCommonName(bytes, line.lowerBound..<colon, readableEnd: bytes.count) {
            i = colon
        }
        while i < line.upperBound && isTokenByte(bytes[i]) {
            if bytes[i] == UInt8(ascii: "_") { underscore = true }
            i &+= 1
        }
        guard i < line.upperBound else { throw i == line.lowerBound ? .emptyFieldName : .invalidFieldName }
        switch bytes[i] {
        case UInt8(ascii: ":"): break
        case SP, HTAB: throw i == line.lowerBound ? .whitespaceBeforeFirstField : .whitespaceBeforeColon
        default: throw i == line.lowerBound ? .emptyFieldName : .invalidFieldName
        }
        guard i > line.lowerBound else { throw .emptyFieldName }
        let name = line.lowerBound..<i
        guard allFieldValueBytes(bytes, (i &+ 1)..<line.upperBound) else { throw .invalidFieldValue }
        return FieldLine(name: name, value: trimmed(bytes, (i &+ 1)..<line.upperBound), nameHasUnderscore: underscore)
    }

    private func noteField(_ bytes: UnsafeRawBufferPointer, _ field: FieldLine, at index: Int, facts: inout FramingFacts,
                           onField: (Int, Range<Int>, Range<Int>) throws(HTTPWireError) -> Void) throws(HTTPWireError) {
        let name = field.name
        switch name.count {
        case 14 where equalsIgnoringCase(bytes, name, "content-length"):
            try facts.addContentLength(bytes, field.value)
        case 17 where equalsIgnoringCase(bytes, name, "transfer-encoding"):
            try facts.addTransferEncoding(bytes, field.value)
        case 10 where equalsIgnoringCase(bytes, name, "connection"):
            facts.addConnection(bytes, field.value)
        default:
            try onField(index, name, field.value)
        }
    }
}

/// Empties the field table for the next head. Element by element from the end: a head has a handful of
/// fields, and `removeAll(keepingCapacity:)` goes through the general `replaceSubrange`, several times
/// the cost. (A table another head value still shares is copied once by the first removal, where
/// `removeAll` would allocate an empty one: either way the other value keeps its fields.)
@inline(__always)
func emptyKeepingCapacity(_ fields: inout [FieldLine]) {
    guard fields.count <= 64 else { return fields.removeAll(keepingCapacity: true) }
    while !fields.isEmpty { fields.removeLast() }
}
