/// Where a message's body ends, as `Content-Length` and `Transfer-Encoding` say, judged strictly: two
/// parsers that disagree about it are how requests are smuggled and how a response desynchronises a
/// connection shared by several clients.
enum MessageFraming {
    /// Why the framing headers are ambiguous, or nil.
    /// - Parameter equalDuplicateLengths: whether several identical `Content-Length` fields are tolerated
    ///   (RFC 9110 §8.6 lets a recipient accept them; requests refuse them, a proxy in front of us may have
    ///   merged or split them).
    static func problem(_ headers: [(name: String, value: String)], equalDuplicateLengths: Bool) -> String? {
        var lengths: [Substring] = []
        var encodings: [String] = []
        for header in headers {
            if HTTPSyntax.isField(header.name, "content-length") {
                lengths.append(HTTPSyntax.trimmedOWS(Substring(header.value)))
            } else if HTTPSyntax.isField(header.name, "transfer-encoding") {
                encodings.append(header.value)
            }
        }
        if !lengths.isEmpty && !encodings.isEmpty { return "Content-Length together with Transfer-Encoding" }
        if lengths.count > 1 && (!equalDuplicateLengths || Set(lengths).count > 1) {
            return equalDuplicateLengths ? "conflicting Content-Length values" : "more than one Content-Length"
        }
        if let length = lengths.first, length.isEmpty || !length.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) {
            return "invalid Content-Length"
        }
        // The only coding evhttp decodes is a lone `chunked`; anything else would be relayed as a body
        // read one way here and another way by the peer.
        if !encodings.isEmpty {
            let codings = encodings.flatMap { $0.split(separator: ",", omittingEmptySubsequences: false) }
                .map { HTTPSyntax.fieldKey(String(HTTPSyntax.trimmedOWS($0))) }
            if codings != ["chunked"] { return "unsupported Transfer-Encoding" }
        }
        return nil
    }
}

extension MessageFraming {
    /// `problem(_:equalDuplicateLengths:)` on a received head's field table (the transport's requests).
    static func problem(_ table: FieldTable, equalDuplicateLengths: Bool) -> String? {
        var lengthCount = 0
        var firstLength = UnsafeRawBufferPointer(start: nil, count: 0)
        var lengthsDiffer = false
        var encodingCount = 0
        for index in 0..<table.count {
            if table.nameIs(index, "content-length") {
                let length = ASCII.trimmedOWS(table.value(index))
                if lengthCount == 0 {
                    firstLength = length
                } else if !length.elementsEqual(firstLength) {
                    lengthsDiffer = true
                }
                lengthCount += 1
            } else if table.nameIs(index, "transfer-encoding") {
                encodingCount += 1
            }
        }
        if lengthCount > 0 && encodingCount > 0 { return "Content-Length together with Transfer-Encoding" }
        if lengthCount > 1 && (!equalDuplicateLengths || lengthsDiffer) {
            return equalDuplicateLengths ? "conflicting Content-Length values" : "more than one Content-Length"
        }
        if lengthCount > 0 && (firstLength.isEmpty || !firstLength.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 })) {
            return "invalid Content-Length"
        }
        if encodingCount > 0 {
            // Exactly one coding in all the fields together, and it is `chunked`.
            var codings = 0
            var onlyChunked = true
            for index in 0..<table.count where table.nameIs(index, "transfer-encoding") {
                ASCII.forEachListElement(table.value(index)) { coding in
                    codings += 1
                    if !ASCII.equalIgnoringCase(coding, "chunked") { onlyChunked = false }
                }
            }
            if codings != 1 || !onlyChunked { return "unsupported Transfer-Encoding" }
        }
        return nil
    }
}
